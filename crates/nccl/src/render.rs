//! Text and JSON for `gdx nccl explain`: the facts, one line per rank-pair class, then the
//! judgement. The JSON is the same data: `{"schema_version":1,"machine":..,"log":{..},
//! "pair_classes":[..],"judged":{..}}`.

use crate::judge::{Judged, Verdict};
use crate::model::NcclLog;
use serde::Serialize;
use std::fmt::Write as _;

/// Version of the JSON layout.
pub const SCHEMA_VERSION: u32 = 1;

/// At most this many ranks are listed in text (all are in the JSON).
const MAX_RANK_ROWS: usize = 32;

/// The `--json` document.
#[derive(Debug, Serialize)]
pub struct ExplainJson<'a> {
    /// Layout version.
    pub schema_version: u32,
    /// What the log was judged against.
    pub machine: &'a str,
    /// The facts.
    pub log: &'a NcclLog,
    /// One row per rank-pair class.
    pub pair_classes: Vec<crate::model::PairClass>,
    /// The judgement.
    pub judged: &'a Judged,
}

/// The JSON text.
pub fn explain_json(log: &NcclLog, judged: &Judged, machine: &str) -> String {
    let doc = ExplainJson {
        schema_version: SCHEMA_VERSION,
        machine,
        log,
        pair_classes: log.pair_classes(),
        judged,
    };
    serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The text report.
pub fn explain_text(log: &NcclLog, judged: &Judged, machine: &str) -> String {
    let mut s = String::new();
    let hosts = log.hosts();
    let nranks = log
        .ranks
        .iter()
        .filter_map(|r| r.nranks)
        .max()
        .map_or(String::new(), |n| format!(" · {n} rank(s)"));
    let nets: Vec<&str> = log.networks.iter().map(|n| n.value.as_str()).collect();
    let mut nets_u: Vec<&str> = Vec::new();
    for n in nets {
        if !nets_u.contains(&n) {
            nets_u.push(n);
        }
    }
    let _ = writeln!(
        s,
        "NCCL {} · {} host(s){nranks} · network {} · {} line(s) read from {} file(s)",
        log.version.as_deref().unwrap_or("(version not in the log)"),
        hosts.len(),
        if nets_u.is_empty() {
            "not reported".to_string()
        } else {
            nets_u.join(", ")
        },
        log.lines,
        log.sources.len()
    );
    if !log.ranks.is_empty() {
        let _ = writeln!(
            s,
            "\nRanks:\n  {:<5} {:<24} {:>4}  busId",
            "rank", "host", "dev"
        );
        let mut ranks = log.ranks.clone();
        ranks.sort_by_key(|r| r.rank);
        for r in ranks.iter().take(MAX_RANK_ROWS) {
            let _ = writeln!(
                s,
                "  {:<5} {:<24} {:>4}  {}",
                r.rank,
                r.host.as_deref().unwrap_or("?"),
                r.cuda_dev.map_or("?".into(), |d| d.to_string()),
                r.bus_id.as_deref().unwrap_or("?")
            );
        }
        if ranks.len() > MAX_RANK_ROWS {
            let _ = writeln!(s, "  ... {} more (see --json)", ranks.len() - MAX_RANK_ROWS);
        }
    }
    nics(&mut s, log);
    let _ = writeln!(s, "\nConnections:");
    let classes = log.pair_classes();
    if classes.is_empty() {
        let _ = writeln!(s, "  none in the log (connections are printed at NCCL_DEBUG=INFO when a communicator first runs a collective)");
    }
    for c in &classes {
        let mut line = format!(
            "  {}: {} on {} channel(s), {} rank pair(s)",
            c.scope, c.transport, c.channels, c.pairs
        );
        if !c.nics.is_empty() {
            let _ = write!(line, " over {}", c.nics.join(", "));
        }
        if c.scope_assumed {
            line.push_str(" [scope inferred]");
        }
        let _ = writeln!(s, "{line}");
    }
    if let Some(f) = &log.topo_file {
        let _ = writeln!(s, "\nTopology file: {f}");
    }
    let _ = writeln!(s, "\nJudgement (against {machine}):");
    for j in &judged.judgements {
        let _ = writeln!(s, "  {:<8}  {}", j.verdict.as_str(), j.subject);
        if j.verdict != Verdict::Info || j.nccl_did != j.subject {
            let _ = writeln!(s, "            NCCL: {}", j.nccl_did);
        }
        if let Some(b) = &j.best {
            let _ = writeln!(s, "            machine: {b}");
        }
        for w in &j.why {
            let _ = writeln!(s, "            why: {w}");
        }
        if let Some(f) = &j.fix {
            let _ = writeln!(s, "            fix: {f}");
        }
    }
    for n in &judged.notes {
        let _ = writeln!(s, "  note: {n}");
    }
    if !log.nccl_warnings.is_empty() {
        let _ = writeln!(s, "\nNCCL warnings:");
        for w in &log.nccl_warnings {
            let _ = writeln!(s, "  {}: {}", w.host.as_deref().unwrap_or("?"), w.value);
        }
    }
    if !log.parse_warnings.is_empty() {
        let _ = writeln!(s, "\nUnreadable lines ({}):", log.parse_warnings.len());
        for w in log.parse_warnings.iter().take(20) {
            let _ = writeln!(s, "  {}:{}: {}", w.source, w.line, w.message);
        }
    }
    s
}

fn nics(s: &mut String, log: &NcclLog) {
    if log.ib_devices.is_empty()
        && log.sockets.is_empty()
        && log.gdr.is_empty()
        && log.ib_unavailable.is_empty()
    {
        return;
    }
    let _ = writeln!(s, "\nNetwork:");
    let mut hosts: Vec<Option<&str>> = Vec::new();
    for d in &log.ib_devices {
        if !hosts.contains(&d.host.as_deref()) {
            hosts.push(d.host.as_deref());
        }
    }
    for h in hosts {
        let devs: Vec<String> = log
            .ib_devices
            .iter()
            .filter(|d| d.host.as_deref() == h)
            .map(|d| {
                let mut t = format!("[{}]{}:{}/{}", d.index, d.name, d.port, d.link);
                for tag in &d.tags {
                    let _ = write!(t, "/{tag}");
                }
                t
            })
            .collect();
        let ro = log
            .ib_devices
            .iter()
            .any(|d| d.host.as_deref() == h && d.relaxed_ordering);
        let _ = writeln!(
            s,
            "  {}: RDMA {}{}",
            h.unwrap_or("?"),
            devs.join(" "),
            if ro { " (relaxed ordering)" } else { "" }
        );
    }
    for u in &log.ib_unavailable {
        let _ = writeln!(
            s,
            "  {}: no RDMA: {}",
            u.host.as_deref().unwrap_or("?"),
            u.value
        );
    }
    if !log.sockets.is_empty() {
        let socks: Vec<String> = log
            .sockets
            .iter()
            .map(|x| format!("{}({})", x.name, x.addr))
            .collect();
        let _ = writeln!(s, "  sockets: {}", socks.join(" "));
    }
    for g in &log.gdr {
        let who = match (&g.name, &g.gpu_bus_id) {
            (Some(n), _) => format!("HCA {} '{n}'", g.hca),
            (None, Some(b)) => format!("GPU {b} / HCA {}", g.hca),
            (None, None) => format!("HCA {}", g.hca),
        };
        let _ = writeln!(
            s,
            "  {}: GPU Direct RDMA {} for {who}{}",
            g.host.as_deref().unwrap_or("?"),
            if g.enabled { "enabled" } else { "DISABLED" },
            g.reason
                .as_deref()
                .map_or(String::new(), |r| format!(" ({r})"))
        );
    }
    if !log.dmabuf_gpus.is_empty() {
        let v: Vec<String> = log.dmabuf_gpus.iter().map(u32::to_string).collect();
        let _ = writeln!(s, "  DMA-BUF available on GPU device(s) {}", v.join(", "));
    }
}
