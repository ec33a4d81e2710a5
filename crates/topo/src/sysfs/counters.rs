//! The NIC's own counters of one RDMA port (`sys/class/infiniband/<dev>/ports/<n>/hw_counters/*`
//! and `.../counters/*`), read before and after a run so that loss and congestion show up as
//! named deltas. A RoCE fabric that drops packets still completes every transfer (RC
//! retransmits), only slower; these counters are how the loss becomes visible.
//!
//! Which counters mean what is one table ([`kind_of`]), from the names the kernel drivers
//! export: Soft-RoCE (`rxe`: `completer_retry_err`, `rcvd_seq_err`, `duplicate_request`, ...),
//! mlx5 (`out_of_sequence`, `packet_seq_err`, `local_ack_timeout_err`, `np_cnp_sent`,
//! `rp_cnp_handled`, `np_ecn_marked_roce_packets`, ...) and the IB port counters
//! (`port_xmit_discards`, `symbol_error`, ...). A counter not in the table is still read and
//! kept in the snapshot, never reported as loss or congestion.

use super::devices::rdma_port_dir;
use super::RootFs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a moving counter says happened on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CounterKind {
    /// A packet was sent again, or a request arrived twice (the sender's retransmission).
    Retransmission,
    /// A packet arrived out of sequence: one before it was lost.
    OutOfSequence,
    /// The receiver had no buffer posted (receiver not ready).
    Rnr,
    /// An acknowledgement did not come in time, or retries ran out.
    Timeout,
    /// Congestion notification packets sent (notification point) or acted on (reaction point).
    Cnp,
    /// Packets that arrived with ECN's congestion-experienced mark.
    EcnMarked,
    /// Packets dropped or damaged at the port (discards, symbol and receive errors, no buffer).
    Drop,
}

impl CounterKind {
    /// Loss (every kind but the congestion signals), as opposed to congestion.
    pub fn is_loss(self) -> bool {
        !matches!(self, CounterKind::Cnp | CounterKind::EcnMarked)
    }
}

/// The kind of a counter by its file name (without the `hw_counters/` or `counters/` part),
/// or `None` for one that means neither loss nor congestion (byte and packet counts).
pub fn kind_of(name: &str) -> Option<CounterKind> {
    use CounterKind::*;
    Some(match name {
        // rxe (drivers/infiniband/sw/rxe/rxe_hw_counters.c) and mlx5 (mlx5/counters.c).
        "completer_retry_err" | "duplicate_request" | "roce_adp_retrans" | "roce_slow_restart" => {
            Retransmission
        }
        "rcvd_seq_err"
        | "out_of_seq_request"
        | "out_of_sequence"
        | "packet_seq_err"
        | "implied_nak_seq_err" => OutOfSequence,
        "rcvd_rnr_err"
        | "send_rnr_err"
        | "retry_rnr_exceeded_err"
        | "rnr_nak_retry_err"
        | "req_rnr_retries_exceeded" => Rnr,
        "retry_exceeded_err"
        | "local_ack_timeout_err"
        | "roce_adp_retrans_to"
        | "req_transport_retries_exceeded" => Timeout,
        "np_cnp_sent" | "rp_cnp_handled" | "rp_cnp_ignored" | "roce_slow_restart_cnps" => Cnp,
        "np_ecn_marked_roce_packets" => EcnMarked,
        // IB port counters (counters/), and mlx5's receive-queue drops.
        "port_xmit_discards"
        | "port_rcv_errors"
        | "symbol_error"
        | "link_error_recovery"
        | "local_link_integrity_errors"
        | "excessive_buffer_overrun_errors"
        | "port_rcv_remote_physical_errors"
        | "out_of_buffer"
        | "link_downed" => Drop,
        _ => return None,
    })
}

/// One reading of a port's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    /// RDMA device, e.g. `rxe0`.
    pub device: String,
    /// Port number.
    pub port: u32,
    /// `hw_counters/<name>` and `counters/<name>` → value.
    pub values: BTreeMap<String, u64>,
    /// The folder read, as shown to the user.
    pub dir: String,
}

impl PortCounters {
    /// True when the port exported no counter at all.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Read every counter of `device`'s port `port` under the root. Missing folders give an empty
/// reading (rxe has no `counters/`); a file that is not a number is left out (a few drivers
/// export text there).
pub fn read_port_counters(fs: &RootFs, device: &str, port: u32) -> PortCounters {
    let dir = rdma_port_dir(device, port);
    let mut values = BTreeMap::new();
    for group in ["hw_counters", "counters"] {
        let gdir = format!("{dir}/{group}");
        for name in fs.names_or_empty(&gdir) {
            if let Some(v) = fs
                .text(&format!("{gdir}/{name}"))
                .and_then(|t| t.trim().parse::<u64>().ok())
            {
                values.insert(format!("{group}/{name}"), v);
            }
        }
    }
    PortCounters {
        device: device.to_string(),
        port,
        values,
        dir: fs.show(&dir),
    }
}

/// One counter that moved during a run and means loss or congestion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterDelta {
    /// `hw_counters/completer_retry_err`.
    pub counter: String,
    /// How much it grew.
    pub delta: u64,
    /// What it means.
    pub kind: CounterKind,
}

/// What a port's counters did between two readings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterDeltas {
    /// RDMA device.
    pub device: String,
    /// Port number.
    pub port: u32,
    /// How many counters both readings had (0: the port exports none, nothing was measured).
    pub read: usize,
    /// The loss and congestion counters that moved, largest first.
    pub moved: Vec<CounterDelta>,
}

impl CounterDeltas {
    /// The loss counters that moved (retransmissions, out of sequence, RNR, timeouts, drops).
    pub fn loss(&self) -> impl Iterator<Item = &CounterDelta> {
        self.moved.iter().filter(|d| d.kind.is_loss())
    }

    /// The congestion counters that moved (CNPs, ECN marks).
    pub fn congestion(&self) -> impl Iterator<Item = &CounterDelta> {
        self.moved.iter().filter(|d| !d.kind.is_loss())
    }

    /// One line: `rxe0/1: hw_counters/completer_retry_err +119 (retransmission), ...`, or that
    /// none moved (out of how many).
    pub fn describe(&self) -> String {
        let head = format!("{}/{}", self.device, self.port);
        if self.read == 0 {
            return format!("{head}: the port exports no counters (nothing measured)");
        }
        if self.moved.is_empty() {
            return format!(
                "{head}: no loss or congestion counter moved ({} counters read)",
                self.read
            );
        }
        let parts: Vec<String> = self
            .moved
            .iter()
            .map(|d| {
                format!(
                    "{} +{} ({})",
                    d.counter,
                    d.delta,
                    serde_json::to_value(d.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                )
            })
            .collect();
        format!("{head}: {}", parts.join(", "))
    }
}

/// The loss and congestion counters that grew from `before` to `after`. A counter that went
/// down (a driver reset) is left out rather than reported as a huge delta.
pub fn deltas(before: &PortCounters, after: &PortCounters) -> CounterDeltas {
    let mut moved: Vec<CounterDelta> = Vec::new();
    let mut read = 0;
    for (name, &a) in &after.values {
        let Some(&b) = before.values.get(name) else {
            continue;
        };
        read += 1;
        let short = name.rsplit('/').next().unwrap_or(name);
        match kind_of(short) {
            Some(kind) if a > b => moved.push(CounterDelta {
                counter: name.clone(),
                delta: a - b,
                kind,
            }),
            _ => {}
        }
    }
    moved.sort_by(|x, y| y.delta.cmp(&x.delta).then(x.counter.cmp(&y.counter)));
    CounterDeltas {
        device: after.device.clone(),
        port: after.port,
        read,
        moved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// rxe's 16 hw_counters (Debian 6.1), as a port exports them.
    const RXE: [&str; 16] = [
        "sent_pkts",
        "rcvd_pkts",
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_rnr_err",
        "send_rnr_err",
        "rcvd_seq_err",
        "ack_deferred",
        "retry_exceeded_err",
        "retry_rnr_exceeded_err",
        "completer_retry_err",
        "send_err",
        "link_downed",
        "rdma_sends",
        "rdma_recvs",
        "lifespan",
    ];

    fn tree(values: &[(&str, &str)]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let d = t
            .path()
            .join("sys/class/infiniband/rxe0/ports/1/hw_counters");
        fs::create_dir_all(&d).unwrap();
        for n in RXE {
            fs::write(d.join(n), "0\n").unwrap();
        }
        for (n, v) in values {
            fs::write(d.join(n), format!("{v}\n")).unwrap();
        }
        t
    }

    #[test]
    fn a_synthetic_rxe_tree_is_read_whole() {
        let t = tree(&[("sent_pkts", "1200"), ("lifespan", "10")]);
        let c = read_port_counters(&RootFs::new(t.path()), "rxe0", 1);
        assert_eq!(c.values.len(), 16, "{c:?}");
        assert_eq!(c.values["hw_counters/sent_pkts"], 1200);
        assert!(
            c.dir.ends_with("sys/class/infiniband/rxe0/ports/1"),
            "{}",
            c.dir
        );
    }

    #[test]
    fn loss_counters_are_named_and_byte_counts_are_not() {
        let t = tree(&[]);
        let fs_ = RootFs::new(t.path());
        let before = read_port_counters(&fs_, "rxe0", 1);
        let d = t
            .path()
            .join("sys/class/infiniband/rxe0/ports/1/hw_counters");
        fs::write(d.join("completer_retry_err"), "119\n").unwrap();
        fs::write(d.join("rcvd_seq_err"), "113\n").unwrap();
        fs::write(d.join("sent_pkts"), "99999\n").unwrap();
        let after = read_port_counters(&fs_, "rxe0", 1);
        let dl = deltas(&before, &after);
        assert_eq!(dl.read, 16);
        let moved: Vec<(&str, u64, CounterKind)> = dl
            .moved
            .iter()
            .map(|m| (m.counter.as_str(), m.delta, m.kind))
            .collect();
        assert_eq!(
            moved,
            vec![
                (
                    "hw_counters/completer_retry_err",
                    119,
                    CounterKind::Retransmission
                ),
                ("hw_counters/rcvd_seq_err", 113, CounterKind::OutOfSequence),
            ]
        );
        assert_eq!(dl.loss().count(), 2);
        assert_eq!(dl.congestion().count(), 0);
        assert!(dl
            .describe()
            .contains("hw_counters/completer_retry_err +119 (retransmission)"));
    }

    #[test]
    fn a_clean_run_moves_nothing_and_says_how_many_were_read() {
        let t = tree(&[("duplicate_request", "5")]);
        let fs_ = RootFs::new(t.path());
        let a = read_port_counters(&fs_, "rxe0", 1);
        let dl = deltas(&a, &a);
        assert!(dl.moved.is_empty());
        assert_eq!(
            dl.describe(),
            "rxe0/1: no loss or congestion counter moved (16 counters read)"
        );
    }

    #[test]
    fn mlx5_congestion_counters_and_ib_port_counters() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sys/class/infiniband/mlx5_0/ports/1");
        fs::create_dir_all(p.join("hw_counters")).unwrap();
        fs::create_dir_all(p.join("counters")).unwrap();
        for (f, v) in [
            ("hw_counters/np_cnp_sent", "10"),
            ("hw_counters/rp_cnp_handled", "10"),
            ("hw_counters/np_ecn_marked_roce_packets", "3"),
            ("hw_counters/out_of_sequence", "0"),
            ("counters/port_xmit_discards", "0"),
            ("counters/port_xmit_data", "7"),
            ("counters/unit", "text, not a number"),
        ] {
            fs::write(p.join(f), format!("{v}\n")).unwrap();
        }
        let fs_ = RootFs::new(t.path());
        let before = read_port_counters(&fs_, "mlx5_0", 1);
        assert_eq!(before.values.len(), 6, "the text file is left out");
        for (f, v) in [
            ("hw_counters/np_cnp_sent", "25"),
            ("hw_counters/np_ecn_marked_roce_packets", "9"),
            ("counters/port_xmit_discards", "2"),
            ("counters/port_xmit_data", "70000"),
        ] {
            fs::write(p.join(f), format!("{v}\n")).unwrap();
        }
        let dl = deltas(&before, &read_port_counters(&fs_, "mlx5_0", 1));
        let kinds: Vec<CounterKind> = dl.moved.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            vec![CounterKind::Cnp, CounterKind::EcnMarked, CounterKind::Drop]
        );
        assert_eq!(dl.congestion().count(), 2);
        assert_eq!(dl.loss().count(), 1);
    }

    #[test]
    fn a_port_without_counters_says_nothing_was_measured() {
        let t = tempfile::tempdir().unwrap();
        let fs_ = RootFs::new(t.path());
        let c = read_port_counters(&fs_, "mlx5_0", 1);
        assert!(c.is_empty());
        assert!(deltas(&c, &c).describe().contains("exports no counters"));
    }

    #[test]
    fn a_counter_that_went_down_is_not_a_delta() {
        let mut a = PortCounters::default();
        a.values.insert("hw_counters/rcvd_seq_err".into(), 50);
        let mut b = a.clone();
        b.values.insert("hw_counters/rcvd_seq_err".into(), 3);
        assert!(deltas(&a, &b).moved.is_empty());
    }
}
