//! The `probe-fabric` active probe: prove the libfabric path by using it. Two RDM endpoints of
//! this process on the provider gdx would choose (`GDX_FABRIC_PROVIDER`, else automatic; tcp
//! is bound to 127.0.0.1), a registered source and destination buffer, a seeded pattern
//! written with `fi_write` from one to the other and read back with `fi_read`, and the bytes
//! compared after each. Only run live and when probes are on; it needs no GPU.

use crate::DoctorError;
use std::time::Duration;

use gdx_base::pattern::{find_mismatch, pattern};
use gdx_fabric::{Endpoint, FabricConfig, Memory, RmaKind, RmaOp};
use serde::Serialize;

/// Bytes the probe writes (unaligned at both ends by one byte, so it is not a page copy).
pub const PROBE_BYTES: usize = 1 << 20;
/// How long each operation may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the fabric probe did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FabricProbe {
    /// Provider name (`tcp;ofi_rxm`, `efa`).
    pub provider: String,
    /// Fabric name.
    pub fabric: String,
    /// Domain name.
    pub domain: String,
    /// MR mode bits the provider asked for, by name.
    pub mr_mode: Vec<String>,
    /// Why gdx chose this provider.
    pub reason: String,
    /// Bytes written and read back.
    pub bytes: usize,
    /// The write's bytes arrived intact.
    pub write_verified: bool,
    /// The read-back matched.
    pub read_verified: bool,
    /// The step that failed, if one did (registration, address exchange, a completion, a
    /// mismatch at an offset).
    pub error: Option<String>,
}

/// Whether the fabric probe ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "detail")]
pub enum FabricProbeState {
    /// Not run, and why (`--no-probe`, a captured root, no libfabric, no provider).
    NotRun(String),
    /// Ran (which may still have failed: see [`FabricProbe::error`]).
    Ran(FabricProbe),
}

/// The seed of the probe's pattern.
const SEED: u64 = 0x6764_785f_6661_6272; // "gdx_fabr"

/// Runs the probe over the provider `provider` names (`None`: automatic). `NotRun` when
/// libfabric or the provider is missing; `Ran` with [`FabricProbe::error`] when a step failed.
pub fn run(provider: Option<String>) -> FabricProbeState {
    let cfg = FabricConfig { provider };
    let (a, b) = match (Endpoint::open(&cfg), Endpoint::open(&cfg)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return FabricProbeState::NotRun(e.to_string()),
    };
    let p = a.provider();
    let mut out = FabricProbe {
        provider: p.provider.clone(),
        fabric: p.fabric.clone(),
        domain: p.domain.clone(),
        mr_mode: p.mr_mode.iter().map(|m| m.to_string()).collect(),
        reason: a.reason().to_string(),
        bytes: PROBE_BYTES,
        write_verified: false,
        read_verified: false,
        error: None,
    };
    if let Err(e) = exercise(&a, &b, &mut out) {
        out.error = Some(e.to_string());
    }
    FabricProbeState::Ran(out)
}

/// Names the probe step a libfabric call failed in, keeping gdx-fabric's error as the source.
fn step(what: impl Into<String>) -> impl FnOnce(gdx_fabric::FabricError) -> DoctorError {
    let step = what.into();
    move |source| DoctorError::FabricStep { step, source }
}

/// Write from `a` into `b`'s buffer, verify; read it back into `a`, verify.
fn exercise(a: &Endpoint, b: &Endpoint, out: &mut FabricProbe) -> Result<(), DoctorError> {
    let n = PROBE_BYTES;
    let src_mem = Memory::alloc(n + 1);
    let data = pattern(n, SEED);
    if !src_mem.write_at(1, &data) {
        return Err(DoctorError::FabricBuffer("the source buffer is too small"));
    }
    let src = a
        .register(src_mem)
        .map_err(step("registering the source"))?;
    let dst = b
        .register(Memory::alloc(n + 1))
        .map_err(step("registering the destination"))?;
    let back = a
        .register(Memory::alloc(n + 1))
        .map_err(step("registering the read-back buffer"))?;
    let addr_b = b.address().map_err(step("endpoint address"))?;
    let addr_a = a.address().map_err(step("endpoint address"))?;
    let peer_b = a
        .insert_peer(&addr_b)
        .map_err(step("inserting the target's address"))?;
    b.insert_peer(&addr_a)
        .map_err(step("inserting the initiator's address"))?;
    let op = |kind, local| RmaOp {
        kind,
        local,
        local_offset: 1,
        peer: peer_b,
        remote: dst.remote(),
        remote_offset: 1,
        len: n as u64,
    };
    a.run(&[op(RmaKind::Write, &src)], TIMEOUT)
        .map_err(step(format!("fi_write of {n} bytes")))?;
    let mut got = vec![0u8; n];
    if !dst.memory().read_at(1, &mut got) {
        return Err(DoctorError::FabricBuffer("reading the destination buffer"));
    }
    if let Some(mismatch) = find_mismatch(&got, SEED) {
        return Err(DoctorError::FabricMismatch {
            op: "fi_write",
            mismatch,
        });
    }
    out.write_verified = true;
    a.run(&[op(RmaKind::Read, &back)], TIMEOUT)
        .map_err(step(format!("fi_read of {n} bytes")))?;
    if !back.memory().read_at(1, &mut got) {
        return Err(DoctorError::FabricBuffer("reading the read-back buffer"));
    }
    if let Some(mismatch) = find_mismatch(&got, SEED) {
        return Err(DoctorError::FabricMismatch {
            op: "fi_read",
            mismatch,
        });
    }
    out.read_verified = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_catches_a_shift() {
        let good = pattern(4096, SEED);
        assert_eq!(find_mismatch(&good, SEED), None);
        let shifted = &pattern(4097, SEED)[1..];
        let e = DoctorError::FabricMismatch {
            op: "fi_write",
            mismatch: find_mismatch(shifted, SEED).unwrap(),
        };
        assert!(
            e.to_string()
                .starts_with("after fi_write: byte 0: expected"),
            "{e}"
        );
    }

    /// The tcp provider (127.0.0.1 only) on this machine: written, read back, verified.
    #[test]
    fn the_probe_writes_and_reads_through_the_tcp_provider() {
        let FabricProbeState::Ran(p) = run(Some("tcp".into())) else {
            panic!("libfabric's tcp provider is installed here (libfabric1)");
        };
        assert_eq!(p.error, None, "{p:?}");
        assert!(p.write_verified && p.read_verified);
        assert!(p.provider.starts_with("tcp"), "{p:?}");
        assert_eq!(p.bytes, PROBE_BYTES);
    }

    #[test]
    fn an_unknown_provider_is_not_run_with_the_reason() {
        let FabricProbeState::NotRun(why) = run(Some("nosuchprov".into())) else {
            panic!("an unknown provider cannot run");
        };
        assert!(why.contains("nosuchprov"), "{why}");
    }
}
