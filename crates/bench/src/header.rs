//! The run header: gdx version and git hash, host, CPU, kernel, CUDA and driver versions,
//! the devices with their PCI addresses, the command line and the method.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::case::{Params, ROTATE_BYTES};
use crate::report::{DeviceDesc, Header, Method};
use crate::Ctx;

/// The protocol in words (also in `docs/bench/README.md`).
pub const METHOD: &str = "per size: warm-up transfers, then timed transfers until the duration \
is spent (within the sample bounds); bandwidth = bytes / median time per transfer; GPU copies \
are timed with device events around batches queued behind a host-function hold (enqueue cost \
excluded), host paths with a monotonic clock around submit+wait; latency = host wall time of \
one transfer and its completion wait (p50, p99); buffers rotate over 256 MiB below that size; \
the destination is compared with the source after the timed loop; CPU time = process \
user+system time during the timed loop per GB moved (loopback counts both agents)";

fn first_line(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .filter(|s| !s.is_empty())
}

fn cpu_model() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let n = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {n} CPUs")
}

/// The method record for `params`.
pub fn method(params: &Params) -> Method {
    Method {
        description: METHOD.into(),
        warmup: params.warmup,
        duration_s: params.duration.as_secs_f64(),
        min_samples: params.min_samples,
        max_samples: params.max_samples,
        iters: params.iters,
        verify: params.verify,
        rotate_bytes: ROTATE_BYTES,
        bandwidth_unit: "GB/s = 1e9 bytes/s".into(),
    }
}

/// The header of a run on this machine. GPUs are listed only when CUDA is already loaded
/// (a GPU case asked) or `with_gpus` is set; the host ceiling only when it was measured
/// already ([`Ctx::host_ceiling`]; the runner fills it in otherwise).
pub fn live_header(
    ctx: &Ctx,
    params: &Params,
    command_line: Vec<String>,
    with_gpus: bool,
) -> Header {
    let mut devices = Vec::new();
    let mut notes = ctx.notes.clone();
    if let Some(t) = &ctx.topo {
        for d in t.gpus().chain(t.nics()) {
            devices.push(DeviceDesc {
                label: d.label.clone(),
                name: d.name.clone(),
                bdf: d.bdf.map(|b| b.to_string()),
                numa: d.numa,
            });
        }
        notes.extend(t.notes.iter().cloned());
    }
    let cuda = if with_gpus {
        Some(match ctx.cuda() {
            Ok(c) => match c.driver_version() {
                Ok(v) => format!("CUDA {v} ({}), {} GPUs", c.path(), ctx.gpu_count()),
                Err(e) => format!("CUDA loaded from {}, version unknown: {e}", c.path()),
            },
            Err(e) => format!("unavailable: {e}"),
        })
    } else {
        None
    };
    let driver = if with_gpus {
        ctx.nvml().and_then(|n| n.driver_version().ok())
    } else {
        None
    };
    Header {
        tool: "gdx".into(),
        gdx_version: env!("CARGO_PKG_VERSION").into(),
        git_hash: GIT_HASH.map(str::to_string),
        host: first_line("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into()),
        cpu: cpu_model(),
        kernel: first_line("/proc/sys/kernel/osrelease"),
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        command_line,
        cuda,
        driver,
        devices,
        method: method(params),
        notes,
        host_ceiling: ctx.host_ceiling_if_measured().cloned(),
        latency_floors: ctx.latency_floors_if_measured().cloned(),
    }
}

/// A fixed header for the mock backend (deterministic output).
pub fn mock_header(params: &Params) -> Header {
    Header {
        tool: "gdx".into(),
        gdx_version: env!("CARGO_PKG_VERSION").into(),
        git_hash: None,
        host: "mock-host".into(),
        cpu: "mock CPU, 2 CPUs".into(),
        kernel: None,
        started_unix_s: 0,
        command_line: vec!["gdx".into(), "bench".into(), "--mock".into()],
        cuda: None,
        driver: None,
        devices: vec![],
        method: method(params),
        notes: vec!["mock backend: figures are synthetic".into()],
        host_ceiling: None,
        latency_floors: None,
    }
}

/// The git commit this binary was built from (`abc123def456`, `-dirty` when the tree had
/// uncommitted changes); `None` when built outside a git checkout.
pub const GIT_HASH: Option<&str> = option_env!("GDX_GIT_HASH");

/// The UTC date the binary was built (`SOURCE_DATE_EPOCH` when set), `YYYY-MM-DD`.
pub const BUILD_DATE: Option<&str> = option_env!("GDX_BUILD_DATE");
