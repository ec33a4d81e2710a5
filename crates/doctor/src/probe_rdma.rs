//! The `probe-rdma` active probe: prove the verbs path by using it. For each RDMA device with
//! an active port, two RC connections of this process on that port (each paired with itself,
//! which is how one host with one port tests RDMA), a seeded 1 MiB buffer written with RDMA
//! WRITE into a registered buffer holding another pattern, then another read with RDMA READ,
//! and the bytes compared after each (by checksum of the whole buffer). Only run live and
//! when probes are on; it needs no GPU.

use gdx_rdma::link::{pattern_checksum, LinkMem, Side};
use gdx_rdma::{EndpointConfig, RdmaError, RdmaOp};
use gdx_topo::sysfs::counters::{deltas, read_port_counters, CounterDeltas};
use gdx_topo::sysfs::devices::rdma_devices;
use gdx_topo::sysfs::RootFs;
use serde::Serialize;
use std::time::Duration;

/// Bytes the probe writes and reads.
pub const PROBE_BYTES: usize = 1 << 20;
/// Longest wait for progress on one operation (Soft-RoCE under emulation is slow).
const TIMEOUT: Duration = Duration::from_secs(20);

/// What the probe did on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RdmaProbe {
    /// RDMA device (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Bytes written and read.
    pub bytes: usize,
    /// The write's bytes arrived intact.
    pub write_verified: bool,
    /// The read's bytes arrived intact.
    pub read_verified: bool,
    /// The step that failed, if one did.
    pub error: Option<String>,
    /// What each port's loss and congestion counters did during the probe.
    pub counters: Vec<CounterDeltas>,
}

/// Whether the probe ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "detail")]
pub enum RdmaProbeState {
    /// Not run, and why (`--no-probe`, a captured root, no RDMA device).
    NotRun(String),
    /// Ran on these devices (each may still have failed: see [`RdmaProbe::error`]).
    Ran(Vec<RdmaProbe>),
}

/// Runs the probe on every device libibverbs lists (at most `max_devices`, in name order).
pub fn run(max_devices: usize) -> RdmaProbeState {
    let mut devices = match gdx_rdma::discover() {
        Ok(d) => d,
        Err(e) => return RdmaProbeState::NotRun(e.to_string()),
    };
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices.truncate(max_devices.max(1));
    RdmaProbeState::Ran(devices.iter().map(|d| run_on(&d.name)).collect())
}

/// The probe on one device.
pub fn run_on(device: &str) -> RdmaProbe {
    let mut out = RdmaProbe {
        device: device.to_string(),
        bytes: PROBE_BYTES,
        write_verified: false,
        read_verified: false,
        error: None,
        counters: Vec::new(),
    };
    // The NIC's counters around the probe: bytes that verify may still have needed
    // retransmissions, which only the counters show.
    let sysfs = RootFs::new("/");
    let ports: Vec<u32> = rdma_devices(&sysfs)
        .into_iter()
        .find(|d| d.name == device)
        .map(|d| d.ports.iter().map(|p| p.port).collect())
        .unwrap_or_default();
    let before: Vec<_> = ports
        .iter()
        .map(|&p| read_port_counters(&sysfs, device, p))
        .collect();
    if let Err(e) = exercise(device, &mut out) {
        out.error = Some(e.to_string());
    }
    out.counters = before
        .iter()
        .map(|b| deltas(b, &read_port_counters(&sysfs, device, b.port)))
        .collect();
    out
}

/// Why the probe's transfers did not verify.
#[derive(Debug, thiserror::Error)]
enum ProbeFailure {
    /// A step of the bring-up or a transfer failed.
    #[error("{step}: {source}")]
    Step {
        /// What was being done.
        step: &'static str,
        /// The verbs error.
        #[source]
        source: RdmaError,
    },
    /// The WRITE completed but the target's bytes are not the source's.
    #[error("after RDMA WRITE the target does not hold the source's bytes")]
    WriteNotVerified,
    /// The READ completed but this side's bytes are not the remote's.
    #[error("after RDMA READ this side does not hold the remote bytes")]
    ReadNotVerified,
}

fn step(step: &'static str) -> impl FnOnce(RdmaError) -> ProbeFailure {
    move |source| ProbeFailure::Step { step, source }
}

/// WRITE seed 1 → a buffer of seed 2, verify; READ a buffer of seed 3 into one of seed 4, verify.
fn exercise(device: &str, out: &mut RdmaProbe) -> Result<(), ProbeFailure> {
    let len = PROBE_BYTES;
    let cfg = EndpointConfig::default();
    let open = |seed| Side::open(LinkMem::Host, len, seed, Some(device), &cfg, 1);
    let mut target = open(2).map_err(step("opening the write target"))?;
    let region = target
        .advertise_buffer()
        .map_err(step("advertising the write target"))?;
    let source = open(1).map_err(step("opening the write source"))?;
    let (s, t) = (source.conn_data().clone(), target.conn_data().clone());
    let mut writer = source.connect(&t).map_err(step("connecting the writer"))?;
    let target = target
        .connect(&s)
        .map_err(step("connecting the write target"))?;
    writer
        .run(RdmaOp::Write, &region, len as u64, 1, TIMEOUT)
        .map_err(step("RDMA WRITE of 1 MiB"))?;
    if target.checksum(len) != Some(pattern_checksum(len, 1)) {
        return Err(ProbeFailure::WriteNotVerified);
    }
    out.write_verified = true;

    let mut far = open(3).map_err(step("opening the read source"))?;
    let region = far
        .advertise_buffer()
        .map_err(step("advertising the read source"))?;
    let near = open(4).map_err(step("opening the read target"))?;
    let (n, f) = (near.conn_data().clone(), far.conn_data().clone());
    let mut reader = near.connect(&f).map_err(step("connecting the reader"))?;
    let _far = far
        .connect(&n)
        .map_err(step("connecting the read source"))?;
    reader
        .run(RdmaOp::Read, &region, len as u64, 1, TIMEOUT)
        .map_err(step("RDMA READ of 1 MiB"))?;
    if reader.checksum(len) != Some(pattern_checksum(len, 3)) {
        return Err(ProbeFailure::ReadNotVerified);
    }
    out.read_verified = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a device (the host) the probe says why it did not run; with one (the RDMA VM)
    /// it runs on each and every byte verifies.
    #[test]
    fn the_probe_runs_where_there_is_a_device_and_says_why_not_elsewhere() {
        match (gdx_rdma::discover(), run(4)) {
            (Ok(devs), RdmaProbeState::Ran(probes)) => {
                assert_eq!(probes.len(), devs.len().min(4));
                for p in probes {
                    assert_eq!(p.error, None, "{p:?}");
                    assert!(p.write_verified && p.read_verified, "{p:?}");
                    // Every port of the device was read around the probe.
                    assert!(!p.counters.is_empty(), "{p:?}");
                }
            }
            (Err(e), RdmaProbeState::NotRun(why)) => assert_eq!(why, e.to_string()),
            (d, r) => panic!("discovery {d:?} but the probe {r:?}"),
        }
    }
}
