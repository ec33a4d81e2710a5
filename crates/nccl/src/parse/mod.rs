//! Reading NCCL INFO logs (2.10 – 2.28 wordings) into an [`NcclLog`].
//!
//! Every recognised message has one small reader below; a message none recognises is
//! skipped (NCCL prints hundreds of lines gdx has no use for). A line that *starts* like a
//! recognised message but does not finish like one (a truncated paste, a garbled write)
//! becomes a [`ParseWarning`] and the rest of the log is still read. Several files (one per
//! rank from `NCCL_DEBUG_FILE=...%h.%p`) and several hosts interleaved in one file are both
//! fine: every fact carries the host from its own line.
//!
//! Invariant: [`parse_text`] never panics, whatever the bytes (a proptest checks it).

use crate::line::{self, Kind, Level, Line};
use crate::model::*;

mod net;
mod read;

pub use read::{parse_files, MAX_LINE_BYTES, MAX_LOG_BYTES};

/// Parse one text (named `source` in warnings).
pub fn parse_text(source: &str, text: &str) -> NcclLog {
    let mut log = NcclLog::default();
    parse_into(&mut log, source, text);
    finish(&mut log);
    log
}

fn parse_into(log: &mut NcclLog, source: &str, text: &str) {
    log.sources.push(source.to_string());
    for (i, raw) in text.lines().enumerate() {
        parse_line(log, source, i + 1, raw);
    }
}

pub(super) fn parse_line(log: &mut NcclLog, source: &str, lineno: usize, raw: &str) {
    // A line may add ranks or connections: answers cached before it would be stale.
    log.forget_index();
    log.lines += 1;
    let Kind::Nccl(l) = line::split(raw) else {
        return;
    };
    let mut cx = Cx {
        log,
        source,
        lineno,
        host: l.origin.host.clone(),
    };
    if cx.message(&l) {
        cx.log.nccl_lines += 1;
    }
}

/// Whole-log warnings, once every file is read.
pub(super) fn finish(log: &mut NcclLog) {
    if log.nccl_lines == 0 {
        log.parse_warnings.push(ParseWarning {
            source: log.sources.join(", "),
            line: 0,
            message: "no NCCL lines found: was the program run with NCCL_DEBUG=INFO?".into(),
        });
    }
    let distinct: std::collections::BTreeSet<&str> =
        log.versions.iter().map(|v| v.value.as_str()).collect();
    if distinct.len() > 1 {
        log.parse_warnings.push(ParseWarning {
            source: log.sources.join(", "),
            line: 0,
            message: format!(
                "several NCCL versions in one job: {}",
                distinct.into_iter().collect::<Vec<_>>().join(", ")
            ),
        });
    }
}

struct Cx<'l> {
    log: &'l mut NcclLog,
    source: &'l str,
    lineno: usize,
    host: Option<String>,
}

impl Cx<'_> {
    fn warn(&mut self, message: String) {
        self.log.parse_warnings.push(ParseWarning {
            source: self.source.to_string(),
            line: self.lineno,
            message,
        });
    }

    fn seen(&self, value: impl Into<String>) -> Seen {
        Seen {
            value: value.into(),
            host: self.host.clone(),
        }
    }

    /// Read one message; true when it was an NCCL line (recognised, or marked INFO/WARN).
    fn message(&mut self, l: &Line<'_>) -> bool {
        let m = l.msg;
        if l.level == Level::Warn {
            self.log.nccl_warnings.push(self.seen(m));
            return true;
        }
        let known = self.version(m)
            || self.net_using(m)
            || self.gdr(m)
            || self.channel(m)
            || self.comm(m)
            || self.env_line(m)
            || self.nvls(m)
            || self.counts(m)
            || self.misc(m)
            || self.system(m);
        known || l.level == Level::Info
    }

    fn version(&mut self, m: &str) -> bool {
        let Some(v) = m.strip_prefix("NCCL version ") else {
            return false;
        };
        let v = v.split_whitespace().next().unwrap_or("").to_string();
        if !v.starts_with(|c: char| c.is_ascii_digit()) {
            self.warn(format!("unreadable NCCL version line: {m:?}"));
            return true;
        }
        if self.log.version.is_none() {
            self.log.version = Some(v.clone());
        }
        if !self
            .log
            .versions
            .iter()
            .any(|s| s.value == v && s.host == self.host)
        {
            let s = self.seen(v);
            self.log.versions.push(s);
        }
        true
    }

    /// `Channel 00/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA`.
    fn channel(&mut self, m: &str) -> bool {
        let Some(rest) = m.strip_prefix("Channel ") else {
            return false;
        };
        // Ring/tree listings (`Channel 00/16 :    0   7   6`) have no arrow.
        if !rest.contains("->") {
            return true;
        }
        match read_connection(rest) {
            Some(mut c) => {
                c.host = self.host.clone();
                self.log.connections.push(c);
            }
            None => self.warn(format!("truncated or unreadable channel line: {m:?}")),
        }
        true
    }

    /// `comm 0x.. rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 1c000 commId 0x.. - Init START`
    /// and `comm 0x.. rank 0 nRanks 24 nNodes 3 localRanks 8 localRank 0 MNNVL 0`.
    fn comm(&mut self, m: &str) -> bool {
        let body = m
            .strip_prefix("ncclCommInitRankConfig ")
            .or_else(|| m.strip_prefix("ncclCommInitRank "))
            .or_else(|| m.strip_prefix("ncclCommInitAll "))
            .unwrap_or(m);
        if !body.starts_with("comm 0x") || !body.contains(" rank ") {
            return false;
        }
        let toks: Vec<&str> = body.split_whitespace().collect();
        let val = |k: &str| -> Option<&str> {
            toks.iter()
                .position(|t| t.eq_ignore_ascii_case(k))
                .and_then(|i| toks.get(i + 1).copied())
        };
        let Some(rank) = val("rank").and_then(|r| r.parse::<u32>().ok()) else {
            self.warn(format!("communicator line without a rank: {m:?}"));
            return true;
        };
        let comm = val("commId").or(toks.get(1).copied()).map(str::to_string);
        let num = |k: &str| val(k).and_then(|v| v.parse::<u32>().ok());
        let host = self.host.clone();
        let existing = self
            .log
            .ranks
            .iter_mut()
            .find(|r| r.rank == rank && r.host == host);
        let r = match existing {
            Some(r) => r,
            None => {
                self.log.ranks.push(RankInfo {
                    rank,
                    host,
                    ..RankInfo::default()
                });
                let last = self.log.ranks.len() - 1;
                &mut self.log.ranks[last]
            }
        };
        r.nranks = r.nranks.or(num("nranks"));
        r.cuda_dev = r.cuda_dev.or(num("cudaDev"));
        r.bus_id = r.bus_id.clone().or(val("busId").map(str::to_string));
        r.nnodes = r.nnodes.or(num("nNodes"));
        if val("commId").is_some() {
            r.comm = comm;
        }
        true
    }

    /// `NCCL_X set by environment to Y` and `NCCL_X set to Y`.
    fn env_line(&mut self, m: &str) -> bool {
        let (var, value) = if let Some((v, val)) = m.split_once(" set by environment to ") {
            (v, val)
        } else if let Some((v, val)) = m.split_once(" set to ") {
            (v, val)
        } else {
            return false;
        };
        let var = var.trim();
        if !var.starts_with("NCCL_") || var.contains(' ') {
            return false;
        }
        // Integer values are printed with a full stop (`to 0.`); paths and names are not.
        let value = value.trim();
        let value = match value.strip_suffix('.') {
            Some(v) if v.parse::<f64>().is_ok() => v,
            _ => value,
        };
        match var {
            "NCCL_TOPO_FILE" => self.log.topo_file = Some(value.to_string()),
            "NCCL_GRAPH_FILE" => self.log.graph_file = Some(value.to_string()),
            _ => {}
        }
        self.log.env.insert(var.to_string(), value.to_string());
        true
    }

    /// `NVLS multicast support is (not) available on dev N`.
    fn nvls(&mut self, m: &str) -> bool {
        let Some(rest) = m.strip_prefix("NVLS multicast support is ") else {
            return false;
        };
        let dev = rest
            .rsplit_once("dev ")
            .and_then(|(_, d)| d.trim().parse::<u32>().ok());
        match (rest.starts_with("not"), dev) {
            (_, None) => self.warn(format!("NVLS line without a device: {m:?}")),
            (true, Some(d)) => {
                self.log.nvls.unavailable_on.insert(d);
            }
            (false, Some(d)) => {
                self.log.nvls.available_on.insert(d);
            }
        }
        true
    }

    /// `2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, ...`.
    fn counts(&mut self, m: &str) -> bool {
        if !m.contains(" coll channels") {
            return false;
        }
        for part in m.split(',') {
            let mut w = part.split_whitespace();
            let (Some(n), Some(kind)) = (w.next().and_then(|n| n.parse::<u32>().ok()), w.next())
            else {
                continue;
            };
            let slot = match kind {
                "nvls" => &mut self.log.nvls.channels,
                "collnet" => &mut self.log.collnet.channels,
                _ => continue,
            };
            *slot = Some(slot.map_or(n, |old| old.max(n)));
        }
        true
    }

    fn misc(&mut self, m: &str) -> bool {
        if let Some(p) = m
            .strip_prefix("NET/Plugin: Loaded collnet plugin ")
            .or_else(|| m.strip_prefix("NET/Plugin : Loaded collnet plugin "))
        {
            self.log.collnet.plugin = Some(p.trim().to_string());
            return true;
        }
        if let Some(d) = m.strip_prefix("DMA-BUF is available on GPU device ") {
            match d.trim().parse::<u32>() {
                Ok(n) => {
                    self.log.dmabuf_gpus.insert(n);
                }
                Err(_) => self.warn(format!("unreadable DMA-BUF line: {m:?}")),
            }
            return true;
        }
        false
    }

    /// `=== System : maxBw 48.0 totalBw 370.8 ===` and its `+ PCI[0.2] - ...` edges.
    fn system(&mut self, m: &str) -> bool {
        if let Some(r) = m.strip_prefix("=== System : ") {
            let toks: Vec<&str> = r.split_whitespace().collect();
            let num = |k: &str| {
                toks.iter()
                    .position(|t| *t == k)
                    .and_then(|i| toks.get(i + 1))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            let sys = self.log.system.get_or_insert_with(SystemPrint::default);
            sys.max_bw = num("maxBw").or(sys.max_bw);
            sys.total_bw = num("totalBw").or(sys.total_bw);
            return true;
        }
        let Some(r) = m.strip_prefix("+ PCI[") else {
            return false;
        };
        if let Some(bw) = r.split_once(']').and_then(|(b, _)| b.parse::<f64>().ok()) {
            let sys = self.log.system.get_or_insert_with(SystemPrint::default);
            sys.min_pci_bw = Some(sys.min_pci_bw.map_or(bw, |o| o.min(bw)));
        }
        true
    }
}

/// `00/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA` (after `Channel `).
fn read_connection(rest: &str) -> Option<Connection> {
    let (chan, rest) = rest.split_once(':')?;
    let channel = chan.trim().split('/').next()?.trim().parse::<u32>().ok()?;
    let (ends, via) = rest.split_once(" via ")?;
    let (a, b) = ends.split_once("->")?;
    let from = rank_ref(a.trim())?;
    let mut b_toks = b.split_whitespace();
    let to = rank_ref(b_toks.next()?)?;
    let direction = match b_toks.next() {
        Some("[send]") => Some(Direction::Send),
        Some("[receive]") => Some(Direction::Receive),
        _ => None,
    };
    let transport = transport(via.trim())?;
    Some(Connection {
        channel,
        from,
        to,
        direction,
        transport,
        host: None,
    })
}

/// `2[c7000]` (bus id: NCCL < 2.12) or `2[0]` (CUDA device).
fn rank_ref(t: &str) -> Option<RankRef> {
    let (r, inner) = t.split_once('[')?;
    let inner = inner.strip_suffix(']')?;
    let rank = r.parse::<u32>().ok()?;
    // Bus ids have at least four hex digits (`1a000`, `100000`); devices are small numbers.
    let (dev, bus_id) = if inner.len() >= 4 {
        if !inner.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        (None, Some(inner.to_ascii_lowercase()))
    } else {
        (Some(inner.parse::<u32>().ok()?), None)
    };
    Some(RankRef { rank, dev, bus_id })
}

/// The `via` text. Anything but P2P, SHM and NET is refused (and warned about by the
/// caller): a truncated `via N` must not pass for a transport.
fn transport(via: &str) -> Option<Transport> {
    if let Some(mode) = via.strip_prefix("P2P/").filter(|m| !m.is_empty()) {
        return Some(Transport::P2p {
            mode: mode.to_string(),
        });
    }
    if let Some(mode) = via.strip_prefix("SHM/").filter(|m| !m.is_empty()) {
        return Some(Transport::Shm {
            mode: mode.to_string(),
        });
    }
    let r = via.strip_prefix("NET/")?;
    let parts: Vec<&str> = r.split('/').collect();
    // The device index is the first numeric part after the plugin name (which itself may
    // contain digits or spaces: `IBext_v8`, `AWS Libfabric`).
    let at = parts
        .iter()
        .skip(1)
        .position(|p| p.parse::<u32>().is_ok())?
        + 1;
    let plugin = parts[..at].join("/");
    let dev = parts[at].parse::<u32>().ok()?;
    let mut gdr = false;
    let mut tags = Vec::new();
    for p in &parts[at + 1..] {
        if let Some(t) = p.strip_prefix("GDRDMA") {
            gdr = true;
            let t = t.trim_matches(|c| c == '(' || c == ')');
            if !t.is_empty() {
                tags.push(t.to_string());
            }
        } else if !p.is_empty() {
            tags.push(p.to_string());
        }
    }
    Some(Transport::Net {
        plugin,
        dev,
        gdr,
        tags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_of_every_wording() {
        let t = |s| transport(s).unwrap();
        assert_eq!(t("P2P/CUMEM/read").class_label(), "P2P/CUMEM/read");
        assert_eq!(t("SHM/direct/direct").class_label(), "SHM/direct/direct");
        assert_eq!(t("NET/IB/3/GDRDMA").to_string(), "NET/IB/3/GDRDMA");
        assert_eq!(t("NET/IB/0").class_label(), "NET/IB without GDRDMA");
        assert_eq!(
            t("NET/IBext_v8/2").class_label(),
            "NET/IBext_v8 without GDRDMA"
        );
        assert_eq!(t("NET/Socket/3").class_label(), "NET/Socket");
        assert!(t("NET/Socket/0").is_socket());
        assert!(matches!(
            t("NET/IB/1/GDRDMA/Shared"),
            Transport::Net {
                gdr: true,
                dev: 1,
                ..
            }
        ));
        assert!(transport("NET/IB/").is_none());
    }

    #[test]
    fn rank_refs_tell_bus_ids_from_devices() {
        assert_eq!(
            rank_ref("2[c7000]").unwrap().bus_id.as_deref(),
            Some("c7000")
        );
        assert_eq!(rank_ref("37[5]").unwrap().dev, Some(5));
        assert!(rank_ref("2[c7").is_none());
    }

    #[test]
    fn merged_ib_list_uses_the_outer_index() {
        let log = parse_text("t", "h:1:2 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]={[2] mlx5_0:1/RoCE, [3] mlx5_1:1/RoCE} [RO]; OOB bond0:169.136.106.9<0>");
        let names: Vec<(u32, &str)> = log
            .ib_devices
            .iter()
            .map(|d| (d.index, d.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [(0, "mlx5_2"), (0, "mlx5_3"), (1, "mlx5_0"), (1, "mlx5_1")]
        );
        assert!(log
            .ib_devices
            .iter()
            .all(|d| d.relaxed_ordering && d.link == "RoCE"));
    }

    #[test]
    fn comm_init_all_lines_give_rank_bus_and_size() {
        let log = parse_text(
            "t",
            "h:7:7 [0] NCCL INFO ncclCommInitAll comm 0x55d0 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 60 commId 0x1f - Init START\n\
             h:7:7 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0\n",
        );
        assert_eq!(log.ranks.len(), 1);
        let r = &log.ranks[0];
        assert_eq!(
            (r.nranks, r.nnodes, r.bus_id.as_deref()),
            (Some(1), Some(1), Some("60"))
        );
        assert_eq!(r.comm.as_deref(), Some("0x1f"));
    }
}
