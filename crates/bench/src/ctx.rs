//! [`Ctx`]: what cases may look at — the topology, the CUDA driver and NVML (loaded on first
//! use, so host-only runs never touch them), and the measured host ceiling
//! ([`crate::hostceil`]). The waivers many cases share (no CUDA driver, a GPU that is not
//! there, no RDMA device) are built here, once, so each missing library is explained once.

use std::sync::OnceLock;

use gdx_sys::cuda::Cuda;
use gdx_sys::nvml::Nvml;
use gdx_sys::Unavailable;
use gdx_topo::Topology;

use crate::case::{Cause, Waived};
use crate::hostceil::HostCeiling;

/// What to do when libcuda does not load (the one fix line every GPU case shares).
pub const CUDA_FIX: &str = "install the NVIDIA driver (it provides libcuda.so.1), or put its \
directory on LD_LIBRARY_PATH; `gdx doctor` checks it";

/// The ceiling the mock backend's rows are judged against, GB/s (`mock::CEILING_GBPS`).
pub const MOCK_CEILING_GBPS: f64 = 50.0;

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
    /// The agent `peer` must be (`--peer etcd:NAME`: its name, instance and cluster): every
    /// connection of the run is checked against it in its own handshake, so a record rewritten
    /// between the lookup and a case's connect cannot redirect the bytes.
    pub peer_expect: Option<gdx_engine::Expected>,
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
    /// libfabric provider for the fabric cases (`--provider`; `None`: `GDX_FABRIC_PROVIDER`,
    /// else automatic).
    pub fabric_provider: Option<String>,
    /// The rails of the tcp cases' peer connection (`--nics`; empty: `GDX_NICS`, else one
    /// rail wherever the kernel routes).
    pub nics: Vec<String>,
    /// The provider the fabric cases would use and why, or why there is none (asked once).
    fabric: OnceLock<Result<(gdx_fabric::ProviderInfo, String), NoFabric>>,
    cuda: OnceLock<Result<Cuda, Unavailable>>,
    nvml: OnceLock<Option<Nvml>>,
    host_ceiling: OnceLock<Option<HostCeiling>>,
    latency_floors: OnceLock<crate::floors::LatencyFloors>,
    /// GPUs the mock backend pretends to have (its cases name GPU0 and GPU1).
    mock_gpus: Option<u32>,
    /// Why RDMA cannot run here (`None`: it can).
    rdma: OnceLock<Option<String>>,
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
        let _ = ctx.cuda.set(Err(Unavailable::new(
            gdx_sys::cuda::SONAME,
            "GPU cases disabled in this context",
        )));
        let _ = ctx.nvml.set(None);
        let _ = ctx
            .rdma
            .set(Some("RDMA cases disabled in this context".into()));
        let _ = ctx.fabric.set(Err(NoFabric::Disabled));
        ctx
    }

    /// The libfabric provider the fabric cases would use (`--provider`, else
    /// `GDX_FABRIC_PROVIDER`, else automatic) and why, asked of gdx-fabric once per run.
    ///
    /// # Errors
    /// Why there is none (no libfabric, the named provider offers no FI_RMA entry).
    pub fn fabric_choice(&self) -> Result<&(gdx_fabric::ProviderInfo, String), &NoFabric> {
        self.fabric
            .get_or_init(|| {
                let cfg = gdx_fabric::FabricConfig {
                    provider: self.fabric_provider.clone(),
                };
                gdx_fabric::would_choose(&cfg).map_err(NoFabric::from)
            })
            .as_ref()
    }

    /// The deterministic mock backend (the mock cases of `mock.rs`).
    pub fn mock() -> Ctx {
        let ctx = Ctx {
            mock: true,
            mock_ceiling_gbps: Some(MOCK_CEILING_GBPS),
            notes: vec!["mock backend: figures are synthetic".into()],
            mock_gpus: Some(2),
            ..Ctx::without_devices()
        };
        let _ = ctx
            .host_ceiling
            .set(Some(HostCeiling::fixed(MOCK_CEILING_GBPS)));
        ctx
    }

    /// The CUDA driver, or why it is unavailable.
    ///
    /// # Errors
    /// The loader's reason (library missing, `cuInit` failed).
    pub fn cuda(&self) -> Result<&Cuda, &Unavailable> {
        self.cuda.get_or_init(Cuda::load).as_ref()
    }

    /// Number of CUDA devices (0 without CUDA; the mock backend's two for the mock).
    pub fn gpu_count(&self) -> u32 {
        if let Some(n) = self.mock_gpus {
            return n;
        }
        self.cuda()
            .ok()
            .and_then(|c| c.device_count().ok())
            .unwrap_or(0)
    }

    /// The CUDA driver with every GPU in `gpus` present, or the shared waiver: "GPU cases: no
    /// CUDA driver" (the loader's message once, as the detail) or "GPU5 cases: GPU5 is not
    /// present (this machine has 2 GPUs)".
    ///
    /// # Errors
    /// The waiver, shared by every case it stops.
    pub fn require_gpus(&self, gpus: &[u32]) -> Result<&Cuda, Waived> {
        let cuda = self.cuda().map_err(|u| {
            Waived::shared(Cause {
                scope: "GPU cases".into(),
                reason: format!("no CUDA driver ({} could not be loaded)", u.library),
                detail: Some(u.to_string()),
                fix: Some(CUDA_FIX.into()),
            })
        })?;
        let count = cuda.device_count().unwrap_or(0);
        if let Some(g) = gpus.iter().find(|&&g| g >= count) {
            return Err(Waived::shared(Cause {
                scope: format!("GPU{g} cases"),
                reason: gpu_missing(*g, count),
                detail: None,
                fix: None,
            }));
        }
        Ok(cuda)
    }

    /// Whether this machine can run RDMA, asked of gdx-rdma's discovery once per run: the
    /// reason ("no RDMA device: libibverbs lists no devices and ...", "no libibverbs: ...",
    /// or no ACTIVE port) when it cannot; `None` when it can.
    fn rdma_missing(&self) -> Option<String> {
        self.rdma
            .get_or_init(|| {
                let devices = match gdx_rdma::discover() {
                    Ok(d) => d,
                    Err(u) => return Some(u.to_string()),
                };
                let active = devices.iter().any(|d| {
                    d.ports
                        .iter()
                        .any(|p| p.state == gdx_sys::verbs::PortState::Active)
                });
                if active {
                    return None;
                }
                let ports: Vec<String> = devices
                    .iter()
                    .flat_map(|d| {
                        d.ports
                            .iter()
                            .map(move |p| format!("{} port {} {}", d.name, p.number, p.state))
                    })
                    .collect();
                Some(format!(
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

    /// Whether this machine can run RDMA (gdx-rdma's discovery, once per run), as the waiver
    /// every rdma case shares.
    ///
    /// # Errors
    /// The waiver.
    pub fn require_rdma(&self) -> Result<(), Waived> {
        match self.rdma_missing() {
            None => Ok(()),
            Some(why) => Err(Waived::shared(Cause {
                scope: "RDMA cases".into(),
                reason: why,
                detail: None,
                fix: Some("`gdx doctor` shows the RDMA checks; `gdx topo` the NICs".into()),
            })),
        }
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

    /// The host ceiling if it was measured already (never measures).
    pub fn host_ceiling_if_measured(&self) -> Option<&HostCeiling> {
        self.host_ceiling.get().and_then(Option::as_ref)
    }

    /// The latency floors if they were measured already (never measures).
    pub fn latency_floors_if_measured(&self) -> Option<&crate::floors::LatencyFloors> {
        self.latency_floors.get()
    }

    /// The host latency floors ([`crate::floors`]), measured once per run on first use.
    pub fn latency_floors(&self) -> &crate::floors::LatencyFloors {
        self.latency_floors
            .get_or_init(crate::floors::LatencyFloors::measure)
    }

    /// The host ceiling ([`crate::hostceil`]), measured once per run on first use.
    pub fn host_ceiling(&self) -> Option<&HostCeiling> {
        self.host_ceiling
            .get_or_init(|| Some(HostCeiling::measure()))
            .as_ref()
    }
}

/// `GPU5 is not present (this machine has 2 GPUs)`.
pub fn gpu_missing(gpu: u32, count: u32) -> String {
    format!(
        "GPU{gpu} is not present (this machine has {count} GPU{})",
        if count == 1 { "" } else { "s" }
    )
}

/// Why the fabric cases have no provider.
#[derive(Debug, thiserror::Error)]
pub enum NoFabric {
    /// A context without devices (tests, `--mock`).
    #[error("fabric cases disabled in this context")]
    Disabled,
    /// gdx-fabric found none (no libfabric, the named provider offers no FI_RMA entry).
    #[error(transparent)]
    Fabric(#[from] gdx_fabric::FabricError),
}
