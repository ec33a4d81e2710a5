//! Fabric cases (`gdx bench --path fabric`, opt-in): one-sided writes through the engine's
//! libfabric transport between two agents — a loopback pair in this process, or this process
//! and a `gdx serve` with `GDX_TRANSPORTS=tcp,fabric` (`--peer`) — over the provider
//! `--provider` names (else `GDX_FABRIC_PROVIDER`, else efa > verbs > cxi > tcp).
//!
//! - **Method**: the host cases' wall-clock loop ([`crate::host`]): every op is timed around
//!   submit + wait, bandwidth and latency come from the same samples, the message rate is
//!   bandwidth / size, and the touched bytes are compared after the timed loop. The route is
//!   checked: a pair that is not reached over fabric fails instead of measuring tcp.
//! - **Judged against**: for the tcp and shm providers (loopback), the host ceiling and the
//!   same-run latency floors of [`crate::floors`] (tcp provider: the raw TCP loopback round
//!   trip; shm provider: the shared-memory flag); for a real NIC provider (efa, verbs, ...),
//!   the NIC's RDMA port rate ([`judged_as`]).
//! - **GPU memory**: `gpu0_to_host_fabric` runs only where the provider offers FI_HMEM and gdx
//!   registers device memory with it; otherwise it is waived with which of the two is missing
//!   ([`gpu_waiver`]) — never measured through a staged path under the fabric name.
//! - **Same-run comparison**: [`with_tcp_comparison`] adds gdx's own tcp transport case to a
//!   selection of fabric cases, so `gdx bench --path fabric --size 1GiB` shows both.

use crate::case::{BenchCase, CaseSpec, Cause, End, Params, PathKind, Waived};
use crate::error::BenchError;
use crate::floors::LatencyFloors;
use crate::host::AgentCase;
use crate::report::Row;
use crate::Ctx;

use gdx_fabric::ProviderInfo;

/// Largest size a latency-floor note is given for (as the host rows: 64 KiB).
const FLOOR_NOTE_MAX: u64 = 64 << 10;

/// What to do when no provider can be used (the fix every fabric case shares).
pub const FABRIC_FIX: &str = "install libfabric (apt-get install libfabric1 libfabric-bin, or \
the AWS EFA installer), or name a provider with --provider / GDX_FABRIC_PROVIDER; `gdx doctor` \
(check `fabric`) lists the providers";

/// Whether a provider runs over the host itself (tcp on 127.0.0.1, shm) rather than a NIC.
pub fn is_loopback_provider(info: &ProviderInfo) -> bool {
    matches!(info.core(), "tcp" | "shm")
}

/// The path whose ceiling a fabric row is judged against: tcp's (the host ceiling on one
/// host, the NIC speed to a peer) for loopback providers or when no provider is known; the
/// RDMA port rate for a real NIC provider. Other paths are returned unchanged.
pub fn judged_as(ctx: &Ctx, path: PathKind) -> PathKind {
    if path != PathKind::Fabric {
        return path;
    }
    match ctx.fabric_choice() {
        Ok((info, _)) if !is_loopback_provider(info) => PathKind::Rdma,
        _ => PathKind::Tcp,
    }
}

/// Why GPU memory is not measured over `info`: the provider lacks FI_HMEM (the engine then
/// stages this end's GPU memory, `fabric-staged`), or it has it (the engine registers GPU
/// memory through FI_HMEM_CUDA). Either way this case does not measure it yet; the reason says
/// which route the engine would take, so the user knows what another provider would change.
pub fn gpu_waiver(info: &ProviderInfo) -> Waived {
    if info.hmem {
        Waived::new(format!(
            "{} offers FI_HMEM: the engine registers GPU memory with it (fi_mr_regattr, \
             FI_HMEM_CUDA), but this case does not measure GPU memory over fabric yet \
             (gdx-engine's gpu_fabric test covers the route)",
            info.provider
        ))
    } else {
        Waived::new(format!(
            "{} (fabric {}, domain {}) does not offer FI_HMEM (device memory registration): \
             the engine stages this end's GPU memory through a host bounce buffer \
             (fabric-staged), which this case does not measure yet",
            info.provider, info.fabric, info.domain
        ))
    }
}

/// "8 B fabric p50 41.2 µs = 1.83× the tcp loopback floor (22.5 µs, same run)" for a small
/// loopback row, `None` for large rows, rows without a p50, windowed rows (`--batch`,
/// `--window`), remote rows, and real NICs.
pub fn floor_note(info: &ProviderInfo, floors: &LatencyFloors, row: &Row) -> Option<String> {
    let p50 = row.lat_p50_us?;
    // A p50 of a whole window (`--batch`/`--window`) is not one round trip.
    let windowed = row
        .note
        .as_deref()
        .is_some_and(|n| n.contains(crate::host::WINDOW_NOTE));
    if row.size_bytes > FLOOR_NOTE_MAX || row.dst != "host" || windowed {
        return None;
    }
    let (floor, name) = match info.core() {
        "tcp" => (floors.tcp_us?, "tcp loopback"),
        "shm" => (floors.shm_flag_us, "shm flag"),
        _ => return None,
    };
    Some(format!(
        "{} fabric p50 {p50:.2} µs = {:.2}× the {name} floor ({floor:.2} µs, same run)",
        gdx_base::bytesize::human_bytes(row.size_bytes),
        p50 / floor.max(1e-9)
    ))
}

/// One fabric case: host memory (or GPU `gpu`) here written into the other agent's region.
struct FabricCase {
    agent: AgentCase,
    gpu: Option<u32>,
}

impl BenchCase for FabricCase {
    fn spec(&self) -> &CaseSpec {
        &self.agent.spec
    }

    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived> {
        if let Some(g) = self.gpu {
            ctx.require_gpus(&[g])?;
        }
        let (info, _) = ctx.fabric_choice().map_err(|why| {
            Waived::shared(Cause {
                scope: "fabric cases".into(),
                reason: why.to_string(),
                detail: None,
                fix: Some(FABRIC_FIX.into()),
            })
        })?;
        match self.gpu {
            Some(_) => Err(gpu_waiver(info)),
            None => Ok(()),
        }
    }

    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError> {
        let info = ctx
            .fabric_choice()
            .map_err(|why| BenchError::Unmeasurable(format!("fabric: {why}")))?
            .0
            .clone();
        let floors = (is_loopback_provider(&info)
            && params.sizes.iter().any(|&s| s <= FLOOR_NOTE_MAX))
        .then(|| ctx.latency_floors());
        let via = format!("{} on {}", info.provider, info.domain);
        self.agent.run(ctx, params, &mut |mut row: Row| {
            row.add_note(&via);
            if let Some(n) = floors.and_then(|f| floor_note(&info, f, &row)) {
                row.add_note(n);
            }
            sink(row);
        })
    }

    fn opt_in(&self) -> bool {
        true
    }
}

/// The fabric cases for `ctx`: against its `--peer` (`ctx.peer`) or a loopback agent, over
/// `ctx.fabric_provider`.
pub fn cases(ctx: &Ctx) -> Vec<Box<dyn BenchCase>> {
    let peer = ctx.peer.as_ref().map(|(a, _)| a.as_str());
    let region = ctx.peer.as_ref().map_or("bench", |(_, r)| r.as_str());
    let dst = peer.map_or(End::Host, |p| End::Remote(p.to_string()));
    let where_ = peer.map_or("a loopback agent in this process".to_string(), |p| {
        format!("the gdx serve agent at {p} (GDX_TRANSPORTS=tcp,fabric)")
    });
    let there = if peer.is_some() {
        "remote_host"
    } else {
        "host"
    };
    let mk = |src: End, gpu: Option<u32>| -> Box<dyn BenchCase> {
        let from = match gpu {
            Some(g) => format!("GPU{g} memory (FI_HMEM)"),
            None => "host memory".into(),
        };
        Box::new(FabricCase {
            agent: AgentCase {
                spec: CaseSpec {
                    key: format!("{}_to_{there}_fabric", src.name()),
                    description: format!(
                        "one-sided write from {from} into {where_}'s region through libfabric \
                         (the engine's fabric transport)"
                    ),
                    path: PathKind::Fabric,
                    src,
                    dst: dst.clone(),
                    bidir: false,
                },
                peer: peer.map(str::to_string),
                region: region.to_string(),
                provider: ctx.fabric_provider.clone(),
            },
            gpu,
        })
    };
    vec![mk(End::Host, None), mk(End::Gpu(0), Some(0))]
}

/// The header note of a run with fabric cases: the provider and why, or why there is none.
pub fn header_note(ctx: &Ctx) -> String {
    match ctx.fabric_choice() {
        Ok((info, why)) => format!(
            "fabric cases: provider {} (fabric {}, domain {}, MR mode [{}], FI_HMEM {}): {why}; \
             same wall-clock method as the tcp cases",
            info.provider,
            info.fabric,
            info.domain,
            if info.mr_mode.is_empty() {
                "none".to_string()
            } else {
                info.mr_mode.join(" ")
            },
            if info.hmem { "yes" } else { "no" }
        ),
        Err(why) => format!("fabric cases: no provider ({why})"),
    }
}

/// `selected` plus gdx's own tcp transport case from `all` (against the same peer) when
/// `selected` has a fabric case and no tcp case: the comparison the fabric rows are read
/// against, measured in the same run.
pub fn with_tcp_comparison(
    mut selected: Vec<Box<dyn BenchCase>>,
    all: Vec<Box<dyn BenchCase>>,
) -> Vec<Box<dyn BenchCase>> {
    let has = |v: &[Box<dyn BenchCase>], p: PathKind| v.iter().any(|c| c.spec().path == p);
    if !has(&selected, PathKind::Fabric) || has(&selected, PathKind::Tcp) {
        return selected;
    }
    if let Some(tcp) = all.into_iter().find(|c| {
        let s = c.spec();
        s.path == PathKind::Tcp && s.src == End::Host
    }) {
        selected.push(tcp);
    }
    selected
}

#[cfg(test)]
mod tests;
