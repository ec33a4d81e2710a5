//! `gdx nccl env`: the `NCCL_*` environment this machine should give NCCL, each variable with
//! its reason, or a reason to leave it unset. Computed from gdx-topo's model (path classes
//! between each GPU and each NIC), gdx-rdma's GID choice, and gdx-doctor's findings.
//!
//! | variable | rule |
//! |---|---|
//! | `NCCL_IB_HCA` | the RDMA NIC(s) nearest each GPU, exact names (`=mlx5_0:1,...`) |
//! | `NCCL_NET_GDR_LEVEL` | unset while every GPU's nearest NIC is PIX/PXB (NCCL's default); `PHB` when the worst is PHB on real hardware; unset for NODE/SYS |
//! | `NCCL_SOCKET_IFNAME` | the machine's PCI network interfaces, exact names, so `docker0`/`virbr0` are never picked |
//! | `NCCL_IB_GID_INDEX` | the RoCE v2 IPv4 GID index, when every RoCE NIC chosen has the same one |
//! | `NCCL_TOPO_FILE` | the XML read with `--xml`; in a VM whose sysfs is flat, a file exported from the host |

use gdx_doctor::{Finding, Status};
use gdx_rdma::gid::{self, NetdevView};
use gdx_topo::{Device, PathClass, Source, Topology};
use serde::Serialize;

/// One recommended variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvVar {
    /// `NCCL_IB_HCA`.
    pub name: String,
    /// The value to export; `None` means leave it unset.
    pub value: Option<String>,
    /// Why.
    pub reason: String,
}

/// A NIC near a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NearNic {
    /// Topology label (`NIC3`).
    pub label: String,
    /// RDMA device name, when the topology knows it.
    pub name: Option<String>,
    /// PCI address.
    pub bdf: Option<String>,
    /// Path class to the GPU.
    pub class: PathClass,
}

/// The nearest NIC(s) of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuNics {
    /// `GPU0`.
    pub gpu: String,
    /// PCI address.
    pub bdf: Option<String>,
    /// Equally near NICs.
    pub nearest: Vec<NearNic>,
}

/// The recommendation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvAdvice {
    /// Where the topology came from.
    pub topology: String,
    /// Per GPU, its nearest NICs.
    pub gpus: Vec<GpuNics>,
    /// The variables, in a fixed order.
    pub vars: Vec<EnvVar>,
}

/// What the recommendation is computed from.
pub struct EnvInput<'a> {
    /// The machine.
    pub topology: &'a Topology,
    /// Netdev states and addresses (for the RoCE GID choice).
    pub netdevs: &'a dyn NetdevView,
    /// The doctor's findings for the same machine (may be empty).
    pub findings: &'a [Finding],
}

fn rdma_name(d: &Device) -> Option<&str> {
    d.nic.as_ref().and_then(|n| n.rdma_name.as_deref())
}

/// True when every GPU sits on the root bus with no real PCIe switch: the flat tree a VM
/// shows when the hypervisor hides the host's switches.
pub fn is_flat_vm(topo: &Topology) -> bool {
    let real_switch = |d: &Device| {
        d.attach
            .switches
            .iter()
            .any(|s| topo.switches.get(s.0).is_some_and(|sw| !sw.is_virtual))
    };
    matches!(topo.source, Source::Sysfs(_))
        && topo.gpus().next().is_some()
        && topo.gpus().all(|g| !real_switch(g))
        && topo.gpus().all(|g| g.numa.is_none())
}

/// The NICs that count for NCCL's network: RDMA devices; for an NCCL XML file that names
/// none (vendor files list bare PCI functions of InfiniBand/EFA class), every NIC.
fn candidate_nics(topo: &Topology) -> Vec<&Device> {
    let rdma: Vec<&Device> = topo.nics().filter(|n| rdma_name(n).is_some()).collect();
    if rdma.is_empty() && matches!(topo.source, Source::NcclXml(_)) {
        topo.nics().collect()
    } else {
        rdma
    }
}

/// Each GPU's NICs to use, from the one NIC ranking (`gdx_topo::nicmap`: ports up first, then
/// path class, software RDMA last, then speed), kept to the NICs NCCL's network counts.
fn nearest(topo: &Topology) -> Vec<GpuNics> {
    let nics = candidate_nics(topo);
    let map = gdx_topo::nicmap::nic_map(topo);
    topo.gpus()
        .map(|g| {
            let preferred = map
                .gpus
                .iter()
                .find(|m| m.memory == g.label)
                .map(|m| m.preferred.as_slice())
                .unwrap_or_default();
            let at =
                |r: &&gdx_topo::RankedNic<'_>| nics.iter().position(|n| std::ptr::eq(*n, r.nic));
            let mut kept: Vec<_> = preferred.iter().filter(|r| at(r).is_some()).collect();
            // The map starts each GPU's tied NICs at a different one (one process per GPU
            // spreads over the rails); here the set matters, in the topology's NIC order.
            kept.sort_by_key(|r| at(r));
            let nearest: Vec<NearNic> = kept
                .into_iter()
                .map(|r| NearNic {
                    label: r.nic.label.clone(),
                    name: rdma_name(r.nic).map(str::to_string),
                    bdf: r.nic.bdf.map(|b| b.to_string()),
                    class: r.class,
                })
                .collect();
            GpuNics {
                gpu: g.label.clone(),
                bdf: g.bdf.map(|b| b.to_string()),
                nearest,
            }
        })
        .collect()
}

fn nic_text(n: &NearNic) -> String {
    match (&n.name, &n.bdf) {
        (Some(name), _) => name.clone(),
        (None, Some(b)) => format!("{} ({b})", n.label),
        (None, None) => n.label.clone(),
    }
}

/// The first active port of an RDMA NIC (port 1 when the topology lists none).
fn port_of(d: &Device) -> u32 {
    d.nic
        .as_ref()
        .and_then(|n| {
            n.ports
                .iter()
                .find(|p| p.state.as_deref().is_none_or(|s| s.contains("ACTIVE")))
                .or(n.ports.first())
                .map(|p| p.port)
        })
        .unwrap_or(1)
}

/// Compute the recommendation.
pub fn recommend(input: &EnvInput<'_>) -> EnvAdvice {
    let topo = input.topology;
    let gpus = nearest(topo);
    let topology = match &topo.source {
        Source::Sysfs(p) => format!("sysfs ({p})"),
        Source::NcclXml(p) => format!("NCCL XML ({p})"),
    };
    let flat = is_flat_vm(topo);
    let vars = vec![
        ib_hca(topo, &gpus),
        gdr_level(&gpus, flat, input.findings),
        socket_ifname(topo),
        gid_index(topo, &gpus, input.netdevs),
        topo_file(topo, flat),
    ];
    EnvAdvice {
        topology,
        gpus,
        vars,
    }
}

fn var(name: &str, value: Option<String>, reason: String) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value,
        reason,
    }
}

fn per_gpu(gpus: &[GpuNics]) -> String {
    gpus.iter()
        .map(|g| {
            let nics: Vec<String> = g.nearest.iter().map(nic_text).collect();
            let class = g
                .nearest
                .first()
                .map_or("-".into(), |n| n.class.to_string());
            format!("{} → {} ({class})", g.gpu, nics.join("+"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn ib_hca(topo: &Topology, gpus: &[GpuNics]) -> EnvVar {
    let name = "NCCL_IB_HCA";
    if gpus.is_empty() {
        return var(name, None, "no GPU in the topology".into());
    }
    if gpus.iter().all(|g| g.nearest.is_empty()) {
        return var(name, None, "no RDMA NIC in the topology".into());
    }
    let mut chosen: Vec<String> = Vec::new();
    for g in gpus {
        for n in &g.nearest {
            if let Some(nm) = &n.name {
                if !chosen.contains(nm) {
                    chosen.push(nm.clone());
                }
            }
        }
    }
    if chosen.is_empty() {
        return var(
            name,
            None,
            format!(
                "the topology does not name the HCAs (NCCL XML without <net> entries), so there is nothing to list; nearest per GPU: {}",
                per_gpu(gpus)
            ),
        );
    }
    let left_out: Vec<&str> = topo
        .nics()
        .filter_map(rdma_name)
        .filter(|n| !chosen.iter().any(|c| c == n))
        .collect();
    let with_ports: Vec<String> = chosen
        .iter()
        .map(|c| {
            let port = topo
                .nics()
                .find(|n| rdma_name(n) == Some(c.as_str()))
                .map_or(1, port_of);
            format!("{c}:{port}")
        })
        .collect();
    let mut reason = format!("nearest RDMA NIC per GPU: {}", per_gpu(gpus));
    if left_out.is_empty() {
        reason.push_str("; every RDMA NIC is some GPU's nearest, so this pins NCCL's own choice");
    } else {
        reason.push_str(&format!(
            "; leaves out {} (no GPU's nearest)",
            left_out.join(", ")
        ));
    }
    reason.push_str(
        "; `=` makes NCCL match names exactly (mlx5_1 would otherwise also match mlx5_10)",
    );
    var(name, Some(format!("={}", with_ports.join(","))), reason)
}

fn gdr_level(gpus: &[GpuNics], flat: bool, findings: &[Finding]) -> EnvVar {
    let name = "NCCL_NET_GDR_LEVEL";
    let worst = gpus
        .iter()
        .filter_map(|g| g.nearest.first().map(|n| (g, n.class)))
        .max_by_key(|(_, c)| c.rank());
    let Some((g, class)) = worst else {
        return var(name, None, "no GPU with an RDMA NIC in the topology".into());
    };
    let mut v = match class {
        PathClass::X | PathClass::Nv(_) | PathClass::Pix | PathClass::Pxb => var(
            name,
            None,
            format!("leave unset: NCCL's default (PXB) already allows GPUDirect RDMA to every GPU's nearest NIC (worst: {} at {class})", g.gpu),
        ),
        PathClass::Phb if flat => var(
            name,
            None,
            format!("leave unset: {}'s NIC is PHB only because this VM shows a flat PCI bus; give NCCL the real tree (NCCL_TOPO_FILE) rather than forcing GDR through the host bridge", g.gpu),
        ),
        PathClass::Phb => var(
            name,
            Some("PHB".into()),
            format!("{}'s nearest NIC is PHB (through the CPU's root complex), beyond NCCL's default PXB, so NCCL would stage through host memory; PHB enables GPUDirect RDMA there, usually faster on current CPUs: measure both", g.gpu),
        ),
        PathClass::Node | PathClass::Sys => var(
            name,
            None,
            format!("leave unset: {}'s nearest NIC is {class}; GPUDirect RDMA across the CPU interconnect is usually slower than staging through host memory", g.gpu),
        ),
    };
    let failing = |id: &str| {
        findings
            .iter()
            .any(|f| f.id == id && f.status == Status::Fail)
    };
    if failing("peermem") && failing("dmabuf") {
        v.reason.push_str("; note: the doctor finds neither nvidia-peermem nor DMA-BUF, so GPU memory cannot be registered and NCCL will not use GDR at any level until one is fixed");
    }
    v
}

fn socket_ifname(topo: &Topology) -> EnvVar {
    let name = "NCCL_SOCKET_IFNAME";
    let virtual_name = |n: &str| {
        ["docker", "virbr", "veth", "lo", "br-", "cni", "flannel"]
            .iter()
            .any(|p| n.starts_with(p))
    };
    let mut ifs: Vec<String> = Vec::new();
    for n in topo.nics() {
        for d in n.nic.iter().flat_map(|i| i.netdevs.iter()) {
            if !virtual_name(d) && !ifs.contains(d) {
                ifs.push(d.clone());
            }
        }
    }
    if ifs.is_empty() {
        return var(
            name,
            None,
            "no PCI network interface in the topology (NCCL XML files list none): set it to the interface of this host's cluster network".into(),
        );
    }
    var(
        name,
        Some(format!("={}", ifs.join(","))),
        "the machine's PCI network interfaces; `=` matches exactly, so docker0, virbr0 and lo are never picked for bootstrap or the socket transport".into(),
    )
}

fn gid_index(topo: &Topology, gpus: &[GpuNics], netdevs: &dyn NetdevView) -> EnvVar {
    let name = "NCCL_IB_GID_INDEX";
    let mut picks: Vec<(String, Result<gdx_rdma::GidChoice, gdx_rdma::GidError>)> = Vec::new();
    let mut any_rdma = false;
    let mut names: Vec<String> = Vec::new();
    for g in gpus {
        for n in g.nearest.iter().filter_map(|n| n.name.clone()) {
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    for nm in &names {
        let Some(dev) = topo.nics().find(|d| rdma_name(d) == Some(nm.as_str())) else {
            continue;
        };
        any_rdma = true;
        let Some(port) = dev.nic.as_ref().and_then(|i| {
            let p = port_of(dev);
            i.ports.iter().find(|x| x.port == p)
        }) else {
            continue;
        };
        if gid::LinkKind::from_text(port.link_layer.as_deref()) != gid::LinkKind::Ethernet {
            continue;
        }
        picks.push((
            nm.clone(),
            gid::select_gid_for_port(nm, port, netdevs, None),
        ));
    }
    if !any_rdma {
        return var(name, None, "no named RDMA NIC near a GPU".into());
    }
    if picks.is_empty() {
        return var(
            name,
            None,
            "InfiniBand: NCCL uses GID 0 with LID routing, no index to set".into(),
        );
    }
    let mut idx: Vec<u32> = Vec::new();
    let mut parts: Vec<String> = Vec::new();
    for (nm, r) in &picks {
        match r {
            Ok(c) => {
                idx.push(c.index);
                parts.push(format!("{nm}: {}", c.reason));
            }
            Err(e) => return var(name, None, format!("leave unset: {e}")),
        }
    }
    idx.dedup();
    if idx.len() == 1 {
        var(name, Some(idx[0].to_string()), parts.join("; "))
    } else {
        var(
            name,
            None,
            format!(
                "leave unset: the RoCE NICs want different GID indexes, and one value applies to all ({}); NCCL ≥ 2.21 picks per NIC itself",
                parts.join("; ")
            ),
        )
    }
}

fn topo_file(topo: &Topology, flat: bool) -> EnvVar {
    let name = "NCCL_TOPO_FILE";
    match &topo.source {
        Source::NcclXml(p) => var(
            name,
            Some(p.clone()),
            "the topology file these recommendations were computed from".into(),
        ),
        Source::Sysfs(_) if flat => var(
            name,
            Some("gdx-nccl-topo.xml".into()),
            "this machine's sysfs shows every GPU directly on the root bus with no PCIe switch and no NUMA node: a VM that hides the host's PCI tree, so NCCL sees PHB and turns GPUDirect RDMA off. Write the host's tree with `gdx topo --export-xml gdx-nccl-topo.xml` on the host (or `gdx topo --root HOST.tar.gz --export-xml gdx-nccl-topo.xml` from a capture), keep the bus ids the VM shows, and point NCCL at it".into(),
        ),
        Source::Sysfs(_) => var(
            name,
            None,
            "leave unset: sysfs shows the real PCI tree, which NCCL reads itself".into(),
        ),
    }
}

/// `export` lines, each after a comment with its reason; unset variables as comments only.
pub fn render_shell(advice: &EnvAdvice) -> String {
    let mut s = format!("# gdx nccl env: from {}\n", advice.topology);
    for v in &advice.vars {
        match &v.value {
            Some(val) => {
                s.push_str(&format!(
                    "# {}\nexport {}={}\n",
                    v.reason,
                    v.name,
                    shell_quote(val)
                ));
            }
            None => s.push_str(&format!("# {}: {}\n", v.name, v.reason)),
        }
    }
    s
}

/// Single-quote a value unless it is plain.
fn shell_quote(v: &str) -> String {
    if v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-./:,".contains(c))
    {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("PHB"), "PHB");
        assert_eq!(shell_quote("=mlx5_0:1"), "'=mlx5_0:1'");
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
