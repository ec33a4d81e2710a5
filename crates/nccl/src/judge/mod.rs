//! The judge: for everything NCCL did, is it the most direct path this machine allows, and
//! when not, why not. The machine is gdx-topo's model (live, a capture, or an NCCL XML file)
//! plus gdx-doctor's findings; the log is an [`NcclLog`].
//!
//! Rules, one per kind of fact (each judgement names its evidence):
//! - GPU Direct RDMA disabled for an HCA that some GPU reaches at PIX/PXB → not the best; the
//!   reasons come from the log (`no module`, NCCL's version) and the doctor (`peermem`,
//!   `dmabuf`, `gpu-gdr-support`, `nccl-env`).
//! - Inter-node `NET/IB` without `GDRDMA` from a GPU whose NIC is PIX/PXB → not the best.
//! - Inter-node `NET/Socket` on a machine with RDMA NICs → not the best.
//! - Same-host `SHM` or `NET` between GPUs joined by NVLink or a PCIe switch → not the best.
//! - P2P inside a host and `GDRDMA` between hosts → the best.
//!
//! The topology describes one machine; a multi-host log is judged as if every host were built
//! the same (cluster nodes usually are), and the judgement says which machine it used.

mod context;
mod gdr;

use crate::model::{Connection, NcclLog, PairClass, Scope, Transport};
use gdx_doctor::checks::nccl_env;
use gdx_doctor::{Finding, Status};
use gdx_topo::{Device, PathClass, PciAddr, Topology};
use serde::Serialize;
use std::collections::BTreeSet;

/// The machine a log is judged against.
#[derive(Debug, Clone, Copy)]
pub struct Machine<'a> {
    /// The topology, when one could be read.
    pub topology: Option<&'a Topology>,
    /// The doctor's findings for the same machine (empty when not run).
    pub findings: &'a [Finding],
}

/// How NCCL's choice compares with the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// NCCL left a more direct path unused.
    NotBest,
    /// Not enough information to say.
    Unknown,
    /// The most direct path the machine allows.
    Best,
    /// Context (NVLS, topology file, environment), not a choice to grade.
    Info,
}

impl Verdict {
    /// Lower-case word for text output.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::NotBest => "NOT BEST",
            Verdict::Unknown => "unknown",
            Verdict::Best => "best",
            Verdict::Info => "info",
        }
    }
}

/// One judged fact.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    /// What it is about: `inter-node: NET/IB without GDRDMA`, `GDR on mlx5_0`.
    pub subject: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What NCCL did, in words.
    pub nccl_did: String,
    /// What the machine allows, when known (`GPU3↔mlx5_3 is PIX: GDRDMA expected`).
    pub best: Option<String>,
    /// Why NCCL did not take it, or why this is the best.
    pub why: Vec<String>,
    /// What to change.
    pub fix: Option<String>,
}

/// All judgements of one log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judged {
    /// Judgements, not-best first.
    pub judgements: Vec<Judgement>,
    /// Notes about the judging itself (which machine, what was assumed).
    pub notes: Vec<String>,
}

impl Judged {
    /// 1 when NCCL left a direct path unused, else 0.
    pub fn exit_code(&self) -> u8 {
        u8::from(
            self.judgements
                .iter()
                .any(|j| j.verdict == Verdict::NotBest),
        )
    }
}

/// NCCL's int64 bus id (`1c000`, `100000`, `60`) as a PCI address: the hex digits of
/// `dddd:bb:dd.f` with the separators removed, printed without leading zeros (so a GPU at
/// `0000:00:06.0`, as on a flat VM bus, is `60`).
pub fn bus_id_to_pci(id: &str) -> Option<PciAddr> {
    let id = id.trim().trim_start_matches("0x");
    if id.is_empty() || id.len() > 13 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let id = format!("{id:0>5}");
    let n = id.len();
    let function = u8::from_str_radix(&id[n - 1..], 16).ok()?;
    let device = u8::from_str_radix(&id[n - 3..n - 1], 16).ok()?;
    let bus = u8::from_str_radix(&id[n - 5..n - 3], 16).ok()?;
    let domain = if n > 5 {
        u32::from_str_radix(&id[..n - 5], 16).ok()?
    } else {
        0
    };
    if function > 7 || device > 31 {
        return None;
    }
    Some(PciAddr {
        domain,
        bus,
        device,
        function,
    })
}

struct Judge<'a> {
    log: &'a NcclLog,
    topo: Option<&'a Topology>,
    findings: &'a [Finding],
    notes: BTreeSet<String>,
}

/// Judge `log` against `machine`.
pub fn judge(log: &NcclLog, machine: Machine<'_>) -> Judged {
    let mut j = Judge {
        log,
        topo: machine.topology,
        findings: machine.findings,
        notes: BTreeSet::new(),
    };
    match j.topo {
        None => {
            j.notes.insert(
                "no topology: path classes are unknown (give --root CAPTURE or --xml FILE)".into(),
            );
        }
        Some(_) if log.hosts().len() > 1 => {
            j.notes.insert(format!(
                "the log names {} hosts; each is judged as if built like the given machine",
                log.hosts().len()
            ));
        }
        Some(_) => {}
    }
    let mut out = Vec::new();
    for class in log.pair_classes() {
        out.push(j.pair_class(&class));
    }
    out.extend(j.gdr_hcas());
    out.extend(j.context());
    out.sort_by_key(|x| x.verdict);
    Judged {
        judgements: out,
        notes: j.notes.into_iter().collect(),
    }
}

impl<'a> Judge<'a> {
    fn finding(&self, id: &str) -> Option<&'a Finding> {
        self.findings.iter().find(|f| f.id == id)
    }

    /// The topology GPU of `rank`: by bus id, else by CUDA ordinal in label order.
    fn gpu_of(&mut self, rank: u32) -> Option<&'a Device> {
        let topo = self.topo?;
        if let Some(bdf) = self.log.rank_bus_id(rank).and_then(|b| bus_id_to_pci(&b)) {
            if let Some(d) = topo.by_bdf(bdf) {
                return Some(d);
            }
            self.notes.insert(format!(
                "rank {rank}'s GPU {bdf} is not in the topology: is it the machine that wrote the log?"
            ));
            return None;
        }
        let dev = self.log.rank_dev(rank)?;
        let d = topo.gpus().nth(dev as usize)?;
        self.notes.insert(
            "ranks without a bus id were matched to GPUs by CUDA ordinal in PCI order".into(),
        );
        Some(d)
    }

    fn nic_named(&self, name: &str) -> Option<&'a Device> {
        self.topo?
            .nics()
            .find(|n| n.nic.as_ref().and_then(|i| i.rdma_name.as_deref()) == Some(name))
    }

    /// The rank of a network connection that printed it (the end on the printing host).
    fn local_rank(c: &Connection) -> u32 {
        match c.direction {
            Some(crate::model::Direction::Receive) => c.to.rank,
            _ => c.from.rank,
        }
    }

    fn connections_of(&self, class: &PairClass) -> Vec<&'a Connection> {
        self.log
            .connections
            .iter()
            .filter(|c| c.transport.class_label() == class.transport)
            .filter(|c| self.log.scope_of(c).0 == class.scope)
            .collect()
    }

    fn did(class: &PairClass) -> String {
        let mut s = format!(
            "{}: {} on {} channel(s), {} rank pair(s)",
            class.scope, class.transport, class.channels, class.pairs
        );
        if !class.nics.is_empty() {
            s.push_str(&format!(" over {}", nic_range(&class.nics)));
        }
        if class.scope_assumed {
            s.push_str(" (scope inferred from the transport)");
        }
        s
    }

    fn pair_class(&mut self, class: &PairClass) -> Judgement {
        let subject = format!("{}: {}", class.scope, class.transport);
        let nccl_did = Self::did(class);
        let conns = self.connections_of(class);
        let mut j = Judgement {
            subject,
            verdict: Verdict::Unknown,
            nccl_did,
            best: None,
            why: Vec::new(),
            fix: None,
        };
        let first = conns.first().map(|c| c.transport.clone());
        match (class.scope, first) {
            (Scope::SameHost, Some(Transport::P2p { .. })) => {
                j.verdict = Verdict::Best;
                j.why
                    .push("peer-to-peer is the direct path between GPUs of one host".into());
            }
            (Scope::InterNode, Some(Transport::Net { gdr: true, .. })) => {
                j.verdict = Verdict::Best;
                j.why
                    .push("the NIC reads and writes GPU memory directly (GPUDirect RDMA)".into());
            }
            (Scope::SameHost, Some(_)) => self.same_host_indirect(&mut j, &conns),
            (Scope::InterNode, Some(t)) if t.is_socket() => self.socket(&mut j),
            (Scope::InterNode, Some(_)) => self.net_without_gdr(&mut j, &conns),
            (_, None) => {}
        }
        j
    }

    /// SHM or NET between GPUs of one host.
    fn same_host_indirect(&mut self, j: &mut Judgement, conns: &[&Connection]) {
        let mut seen = BTreeSet::new();
        for c in conns {
            if !seen.insert((c.from.rank, c.to.rank)) {
                continue;
            }
            let (Some(a), Some(b)) = (self.gpu_of(c.from.rank), self.gpu_of(c.to.rank)) else {
                continue;
            };
            let Some(topo) = self.topo else { break };
            let class = topo.path_class(a, b);
            if matches!(class, PathClass::Nv(_)) || class.is_pcie_local() {
                j.verdict = Verdict::NotBest;
                j.best = Some(format!("{}↔{} is {class}: P2P expected", a.label, b.label));
                break;
            }
            j.verdict = Verdict::Best;
            j.best = Some(format!("{}↔{} is {class}", a.label, b.label));
        }
        if j.verdict == Verdict::Best {
            j.why.push("the GPUs are beyond NCCL's default P2P level (PXB): going through host memory is expected".into());
        }
        for (var, value) in &self.log.env {
            if matches!(
                var.as_str(),
                "NCCL_P2P_DISABLE" | "NCCL_P2P_LEVEL" | "NCCL_SHM_DISABLE"
            ) {
                if let Some((_, what, fix)) = nccl_env::judge(var, value) {
                    j.why.push(format!("{var}={value}: {what}"));
                    j.fix.get_or_insert(fix);
                }
            }
        }
        if let Some(f) = self.finding("p2p").filter(|f| f.status == Status::Fail) {
            j.why.push(format!("doctor p2p: {}", f.message));
            if j.fix.is_none() {
                j.fix = f.fix.clone();
            }
        }
        if j.verdict == Verdict::Unknown && self.topo.is_some() {
            j.why
                .push("the ranks' GPUs could not be placed in the topology".into());
        }
    }

    /// Inter-node over TCP sockets.
    fn socket(&mut self, j: &mut Judgement) {
        for s in &self.log.ib_unavailable {
            j.why.push(format!("NCCL said: {}", s.value));
        }
        for (var, value) in &self.log.env {
            if matches!(var.as_str(), "NCCL_IB_DISABLE" | "NCCL_NET") {
                if let Some((_, what, fix)) = nccl_env::judge(var, value) {
                    j.why.push(format!("{var}={value}: {what}"));
                    j.fix.get_or_insert(fix);
                }
            }
        }
        let Some(topo) = self.topo else { return };
        let rdma: Vec<String> = topo
            .nics()
            .filter_map(|n| n.nic.as_ref().and_then(|i| i.rdma_name.clone()))
            .collect();
        if rdma.is_empty() {
            j.verdict = Verdict::Best;
            j.best = Some("the machine has no RDMA NIC".into());
            j.why.push("TCP sockets are the only network path".into());
        } else {
            j.verdict = Verdict::NotBest;
            j.best = Some(format!("RDMA NICs {}: NET/IB expected", nic_range(&rdma)));
            if let Some(f) = self
                .finding("rdma-devices")
                .filter(|f| f.status != Status::Pass)
            {
                j.why.push(format!("doctor rdma-devices: {}", f.message));
            }
            j.fix.get_or_insert_with(|| {
                "make libibverbs and the RDMA devices visible to the job (container: --device /dev/infiniband), unset NCCL_IB_DISABLE".into()
            });
        }
    }

    /// Inter-node `NET/IB` without `GDRDMA`.
    fn net_without_gdr(&mut self, j: &mut Judgement, conns: &[&Connection]) {
        let mut local: Option<String> = None;
        let mut far: Option<String> = None;
        let mut hcas: Vec<String> = Vec::new();
        for c in conns {
            let Transport::Net { plugin, dev, .. } = &c.transport else {
                continue;
            };
            let name = self.log.net_name(plugin, *dev, c.host.as_deref());
            let Some(gpu) = self.gpu_of(Self::local_rank(c)) else {
                continue;
            };
            let Some(topo) = self.topo else { continue };
            // A topology that names no HCA (NCCL XML): the GPU's nearest NIC stands in.
            let nic = self.nic_named(&name).or_else(|| {
                let named = topo
                    .nics()
                    .any(|n| n.nic.as_ref().is_some_and(|i| i.rdma_name.is_some()));
                (!named)
                    .then(|| topo.nearest_nics(gpu).into_iter().next().map(|(n, _)| n))
                    .flatten()
            });
            let Some(nic) = nic else { continue };
            let class = topo.pcie_class(gpu, nic);
            let text = format!("{}↔{name} is {class}", gpu.label);
            if class.is_pcie_local() {
                local.get_or_insert(format!("{text}: GDRDMA expected"));
                if !hcas.contains(&name) {
                    hcas.push(name);
                }
            } else {
                far.get_or_insert(text);
            }
        }
        if let Some(best) = local {
            j.verdict = Verdict::NotBest;
            j.best = Some(best);
            let mut why = Vec::new();
            let mut fix = None;
            for h in &hcas {
                let (w, f) = self.gdr_reasons(Some(h));
                for x in w {
                    if !why.contains(&x) {
                        why.push(x);
                    }
                }
                fix = fix.or(f);
            }
            j.why = why;
            j.fix = fix;
        } else if let Some(far) = far {
            j.verdict = Verdict::Best;
            j.best = Some(far);
            j.why.push(
                "the NIC is beyond NCCL's GDR level (PXB): staging through host memory is expected"
                    .into(),
            );
        } else {
            let (why, _) = self.gdr_reasons(None);
            j.why = why;
            if self.topo.is_some() {
                j.why.push("the ranks' GPUs or NICs could not be placed in the topology (no bus ids or NIC names in the log)".into());
            }
        }
    }
}

/// `mlx5_0–mlx5_3` for a run of names, else a comma list.
fn nic_range(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [first, .., last] if names.len() > 3 => format!("{first}–{last}"),
        _ => names.join(", "),
    }
}

/// `2.22.3+cuda12.6` → (2, 22, 3).
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let core = v.split('+').next()?;
    let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_bus_ids_decode() {
        assert_eq!(bus_id_to_pci("1c000").unwrap().to_string(), "0000:1c:00.0");
        assert_eq!(bus_id_to_pci("100000").unwrap().to_string(), "0001:00:00.0");
        assert_eq!(bus_id_to_pci("c7000").unwrap().to_string(), "0000:c7:00.0");
        assert_eq!(bus_id_to_pci("60").unwrap().to_string(), "0000:00:06.0");
        assert!(bus_id_to_pci("").is_none());
        assert!(bus_id_to_pci("zz000").is_none());
    }

    #[test]
    fn versions_compare() {
        assert_eq!(parse_version("2.22.3+cuda12.6"), Some((2, 22, 3)));
        assert!(parse_version("2.9.9").unwrap() < (2, 13, 0));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn nic_ranges() {
        let v: Vec<String> = (0..4).map(|i| format!("mlx5_{i}")).collect();
        assert_eq!(nic_range(&v), "mlx5_0–mlx5_3");
        assert_eq!(nic_range(&v[..2]), "mlx5_0, mlx5_1");
    }
}
