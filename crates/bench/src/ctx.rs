//! [`Ctx`]: what cases may look at — the topology, the CUDA driver and NVML (loaded on first
//! use, so host-only runs never touch them), and the measured `memcpy` baseline.

use std::sync::OnceLock;
use std::time::Instant;

use gdx_sys::cuda::Cuda;
use gdx_sys::nvml::Nvml;
use gdx_topo::Topology;

/// The run's view of the machine.
#[derive(Debug, Default)]
pub struct Ctx {
    /// The topology, when it could be read.
    pub topo: Option<Topology>,
    /// Mock backend: mock cases, fixed figures.
    pub mock: bool,
    /// The ceiling the mock cases are judged against.
    pub mock_ceiling_gbps: Option<f64>,
    /// Address of a `gdx serve` agent for the shm/tcp cases (a loopback agent when `None`),
    /// and the name of the region it serves.
    pub peer: Option<(String, String)>,
    /// Why the topology is missing, or other notes for the header.
    pub notes: Vec<String>,
    /// Address of a `gdx serve --rdma-listen` for the rdma cases (a loopback server in this
    /// process when `None`).
    pub rdma_peer: Option<String>,
    /// RDMA device for the rdma cases (`None`: the NIC nearest to the local memory).
    pub rdma_device: Option<String>,
    /// Directory for the file cases' scratch files (`--file-dir`); `None`: `GDX_BENCH_DIR`,
    /// else the system temp dir (see [`crate::file::scratch_dir`]).
    pub file_dir: Option<std::path::PathBuf>,
    cuda: OnceLock<Result<Cuda, String>>,
    nvml: OnceLock<Option<Nvml>>,
    memcpy: OnceLock<Option<f64>>,
    rdma: OnceLock<Result<(), String>>,
}

impl Ctx {
    /// The live machine: the topology from sysfs (+ NVML); CUDA loads when a GPU case asks.
    pub fn live() -> Ctx {
        let mut ctx = Ctx::default();
        match gdx_topo::discover() {
            Ok(t) => ctx.topo = Some(t),
            Err(e) => ctx
                .notes
                .push(format!("topology unavailable ({e}): no ceilings")),
        }
        ctx
    }

    /// The live machine with a given topology (e.g. a capture), for ceilings.
    pub fn with_topology(topo: Topology) -> Ctx {
        Ctx {
            topo: Some(topo),
            ..Ctx::default()
        }
    }

    /// No topology, no CUDA, no NVML: GPU cases are waived. For listing and tests.
    pub fn without_devices() -> Ctx {
        let ctx = Ctx::default();
        let _ = ctx
            .cuda
            .set(Err("GPU cases disabled in this context".into()));
        let _ = ctx.nvml.set(None);
        let _ = ctx
            .rdma
            .set(Err("RDMA cases disabled in this context".into()));
        ctx
    }

    /// The deterministic mock backend (see [`crate::mock`]).
    pub fn mock() -> Ctx {
        let ctx = Ctx {
            mock: true,
            mock_ceiling_gbps: Some(crate::mock::CEILING_GBPS),
            notes: vec!["mock backend: figures are synthetic".into()],
            ..Ctx::without_devices()
        };
        let _ = ctx.memcpy.set(Some(crate::mock::CEILING_GBPS));
        ctx
    }

    /// The CUDA driver, or why it is unavailable.
    ///
    /// # Errors
    /// The loader's reason (library missing, `cuInit` failed).
    pub fn cuda(&self) -> Result<&Cuda, String> {
        self.cuda
            .get_or_init(|| Cuda::load().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Number of CUDA devices (0 without CUDA).
    pub fn gpu_count(&self) -> u32 {
        self.cuda()
            .ok()
            .and_then(|c| c.device_count().ok())
            .unwrap_or(0)
    }

    /// Whether this machine can run RDMA, asked of gdx-rdma's discovery once per run: `Err`
    /// with the reason ("no RDMA device: libibverbs lists no devices and ...", "no
    /// libibverbs: ...", or no ACTIVE port) when it cannot.
    ///
    /// # Errors
    /// The reason, for the rdma cases' waiver.
    pub fn rdma(&self) -> Result<(), String> {
        self.rdma
            .get_or_init(|| {
                let devices = gdx_rdma::discover().map_err(|u| u.to_string())?;
                let active = devices.iter().any(|d| {
                    d.ports
                        .iter()
                        .any(|p| p.state == gdx_sys::verbs::PortState::Active)
                });
                if active {
                    return Ok(());
                }
                let ports: Vec<String> = devices
                    .iter()
                    .flat_map(|d| {
                        d.ports
                            .iter()
                            .map(move |p| format!("{} port {} {}", d.name, p.number, p.state))
                    })
                    .collect();
                Err(format!(
                    "no ACTIVE RDMA port ({})",
                    if ports.is_empty() {
                        "no ports".to_string()
                    } else {
                        ports.join(", ")
                    }
                ))
            })
            .clone()
    }

    /// NVML, when it loads.
    pub fn nvml(&self) -> Option<&Nvml> {
        self.nvml.get_or_init(|| Nvml::load().ok()).as_ref()
    }

    /// The highest NVML GPU utilisation (%) of the GPUs with these indices, when NVML gives
    /// it. NVML averages over its own sample period (1/6 s to 1 s), so the figure is coarse.
    pub fn gpu_util_pct(&self, gpus: &[u32]) -> Option<f64> {
        let nvml = self.nvml()?.wrapper();
        gpus.iter()
            .filter_map(|&i| nvml.device_by_index(i).ok()?.utilization_rates().ok())
            .map(|u| f64::from(u.gpu))
            .reduce(f64::max)
    }

    /// Single-thread `memcpy` GB/s between two 256 MiB buffers (best of 5 after a warm-up),
    /// measured once per run; the ceiling of host ↔ host paths.
    pub fn memcpy_gbps(&self) -> Option<f64> {
        *self.memcpy.get_or_init(|| {
            let n = 256usize << 20;
            let src = vec![1u8; n];
            let mut dst = vec![0u8; n];
            dst.copy_from_slice(&src);
            let mut t: Vec<f64> = (0..5)
                .map(|_| {
                    let s = Instant::now();
                    dst.copy_from_slice(std::hint::black_box(&src));
                    std::hint::black_box(&mut dst);
                    s.elapsed().as_secs_f64()
                })
                .collect();
            t.sort_by(f64::total_cmp);
            Some(n as f64 / t[0] / 1e9)
        })
    }
}
