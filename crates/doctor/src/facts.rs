//! Run-time facts that only the vendor libraries know (CUDA attributes, NVML P2P status,
//! verbs port MTUs, cuFile mode), behind one small trait so tests inject them and the CLI
//! wires the live implementation from `gdx-sys`.
//!
//! Invariant: these facts describe the machine the process runs on. When `--root` points at a
//! captured machine the doctor does not consult them at all (see [`crate::Options`]).

use gdx_topo::PciAddr;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a library's facts are missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnavailableKind {
    /// The library is not installed or does not load (no soname found, missing symbol).
    Missing,
    /// The library loads but initialising or querying it failed (e.g. `cuInit` error).
    Failed,
    /// Nobody asked: the caller has no implementation for this library yet. Checks that
    /// need it skip instead of failing, since nothing is known to be wrong.
    NotQueried,
}

/// A library whose facts could not be gathered, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// Library name, e.g. `libcuda.so.1`.
    pub library: String,
    /// What went wrong.
    pub kind: UnavailableKind,
    /// The loader's or the library's own message (sonames tried, error code).
    pub reason: String,
}

impl Unavailable {
    /// The library is missing.
    pub fn missing(library: &str, reason: impl Into<String>) -> Self {
        Unavailable {
            library: library.into(),
            kind: UnavailableKind::Missing,
            reason: reason.into(),
        }
    }

    /// The library loaded but failed.
    pub fn failed(library: &str, reason: impl Into<String>) -> Self {
        Unavailable {
            library: library.into(),
            kind: UnavailableKind::Failed,
            reason: reason.into(),
        }
    }

    /// Not queried by the caller.
    pub fn not_queried(library: &str, reason: impl Into<String>) -> Self {
        Unavailable {
            library: library.into(),
            kind: UnavailableKind::NotQueried,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            UnavailableKind::Missing => "not loadable",
            UnavailableKind::Failed => "failed",
            UnavailableKind::NotQueried => "not queried",
        };
        write!(f, "{} {what}: {}", self.library, self.reason)
    }
}

/// What the CUDA driver API says (`cuInit`, `cuDriverGetVersion`, `cuDeviceGetAttribute`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaFacts {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: Option<i32>,
    /// Where libcuda was loaded from, when known.
    pub library_path: Option<String>,
    /// Devices in CUDA ordinal order.
    pub devices: Vec<CudaDevice>,
}

impl CudaFacts {
    /// What a healthy machine reports (a starting point for tests): CUDA 13.0 loaded from
    /// `library_path`, an NVIDIA H200 at each of `gpus` (ordinals in that order) with GPUDirect
    /// RDMA (with VMM too), dma-buf and peer access to every other; stream memory operations not
    /// asked.
    pub fn healthy(library_path: &str, gpus: &[PciAddr]) -> CudaFacts {
        let n = gpus.len() as u32;
        CudaFacts {
            driver_version: Some(13000),
            library_path: Some(library_path.into()),
            devices: (0..n)
                .zip(gpus)
                .map(|(i, &bdf)| CudaDevice {
                    ordinal: i,
                    name: Some("NVIDIA H200".into()),
                    bdf: Some(bdf),
                    gdr_supported: Some(true),
                    gdr_with_vmm_supported: Some(true),
                    dmabuf_supported: Some(true),
                    can_access_peer: (0..n).filter(|&j| j != i).map(|j| (j, true)).collect(),
                    stream_mem_ops: None,
                })
                .collect(),
        }
    }
}

/// One CUDA device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaDevice {
    /// CUDA ordinal (depends on `CUDA_DEVICE_ORDER` / `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    /// `cuDeviceGetName`.
    pub name: Option<String>,
    /// PCI address from `cuDeviceGetPCIBusId`; this is how ordinals map to GPU labels.
    pub bdf: Option<PciAddr>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (116); `None` on drivers that lack it.
    pub gdr_supported: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` (110).
    pub gdr_with_vmm_supported: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124); `None` before CUDA 11.7.
    pub dmabuf_supported: Option<bool>,
    /// `cuDeviceCanAccessPeer` towards other ordinals: `(peer ordinal, can access)`.
    pub can_access_peer: Vec<(u32, bool)>,
    /// Stream memory operations and mapped host memory (GPUDirect Async, the mailbox);
    /// `None` when not queried.
    #[serde(default)]
    pub stream_mem_ops: Option<StreamMemOpsFacts>,
}

/// `gdx_sys::cuda::StreamMemOps` as facts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMemOpsFacts {
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS` (122).
    pub ops_64bit: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR` (123).
    pub wait_nor: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES` (98).
    pub flush_remote_writes: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY` (19).
    pub map_host_memory: bool,
    /// The driver exports `cuStreamWriteValue64_v2` and `cuStreamWaitValue64_v2`.
    pub symbols: bool,
}

/// NVML's P2P status between two GPUs, as `nvmlDeviceGetP2PStatus` text
/// (`OK`, `CNS`, `GNS`, `TNS`, `NS`, `DR`, `U`: the `nvidia-smi topo -p2p` legend).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlP2p {
    /// The peer GPU.
    pub peer: PciAddr,
    /// `NVML_P2P_CAPS_INDEX_READ`.
    pub read: Option<String>,
    /// `NVML_P2P_CAPS_INDEX_WRITE`.
    pub write: Option<String>,
    /// `NVML_P2P_CAPS_INDEX_NVLINK`.
    pub nvlink: Option<String>,
}

/// `nvmlDeviceGetGpuFabricInfo` on NVSwitch systems.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricInfo {
    /// `not_supported`, `not_started`, `in_progress` or `completed`.
    pub state: String,
    /// The registration status once completed (`success` or an NVML error name).
    pub status: Option<String>,
}

/// One GPU as NVML sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlDevice {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// PCI address.
    pub bdf: Option<PciAddr>,
    /// Product name.
    pub name: Option<String>,
    /// `nvmlDeviceGetBAR1MemoryInfo` total.
    pub bar1_bytes: Option<u64>,
    /// Framebuffer total.
    pub memory_bytes: Option<u64>,
    /// P2P status to each other GPU.
    pub p2p: Vec<NvmlP2p>,
    /// Number of NVLinks that are up.
    pub nvlinks_active: u32,
    /// Link numbers that exist but are down (`nvmlDeviceGetNvLinkState` = inactive).
    pub nvlinks_down: Vec<u32>,
    /// Per-link one-direction bandwidth in GB/s, when NVML reports it (else doctor assumes
    /// from the compute capability).
    pub nvlink_gbps_per_link: Option<f64>,
    /// Fabric registration state, on NVSwitch systems.
    pub fabric: Option<FabricInfo>,
}

/// What NVML says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlFacts {
    /// Driver version, e.g. `580.159.04`.
    pub driver_version: Option<String>,
    /// GPUs in NVML order.
    pub devices: Vec<NvmlDevice>,
}

/// NCCL's dma-buf probe: `ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd=-1, 0)` on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result", content = "detail")]
pub enum DmabufProbe {
    /// errno EBADF: the kernel and provider understand dma-buf MRs.
    Supported,
    /// errno EOPNOTSUPP / EPROTONOSUPPORT (the text names which).
    NotSupported(String),
    /// Anything else (no device to open, PD allocation failed).
    Error(String),
}

/// One verbs port (`ibv_query_port`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsPort {
    /// Port number.
    pub port: u32,
    /// `active_mtu` in bytes (256..4096).
    pub active_mtu: Option<u32>,
    /// `max_mtu` in bytes.
    pub max_mtu: Option<u32>,
}

/// One verbs device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsDevice {
    /// `mlx5_0`.
    pub name: String,
    /// Ports as verbs reports them.
    pub ports: Vec<VerbsPort>,
}

/// What libibverbs says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsFacts {
    /// Devices from `ibv_get_device_list`.
    pub devices: Vec<VerbsDevice>,
    /// Whether the loaded libibverbs exports `ibv_reg_dmabuf_mr` (rdma-core >= v34); `None`
    /// when not looked up.
    pub has_reg_dmabuf_mr: Option<bool>,
    /// NCCL's dma-buf probe on the first device, when a device exists.
    pub dmabuf_probe: Option<DmabufProbe>,
}

/// What `cuFileDriverOpen` answered, as recorded data (the text is cuFile's, kept verbatim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverOpen {
    /// The driver opened.
    Opened,
    /// It refused, with cuFile's error text.
    Refused(String),
}

/// What cuFile says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CufileFacts {
    /// `cuFileGetVersion`, when available.
    pub version: Option<String>,
    /// `cuFileDriverOpen`'s outcome; `None` when not tried.
    pub driver_open: Option<DriverOpen>,
    /// nvidia-fs version from `cuFileDriverGetProperties`, when the module is in use.
    pub nvfs_version: Option<String>,
    /// True when cuFile reports it will run in compatibility (POSIX, host-staged) mode.
    pub compat_mode: Option<bool>,
}

/// The source of live facts. The CLI implements it with `gdx-sys`; tests use [`StaticFacts`].
/// Each method is called at most once per doctor run.
pub trait LiveFacts {
    /// CUDA driver facts.
    fn cuda(&self) -> Result<CudaFacts, Unavailable>;
    /// NVML facts.
    fn nvml(&self) -> Result<NvmlFacts, Unavailable>;
    /// libibverbs facts.
    fn verbs(&self) -> Result<VerbsFacts, Unavailable>;
    /// cuFile facts.
    fn cufile(&self) -> Result<CufileFacts, Unavailable>;
    /// NVML's view of NVLinks, BAR1 and P2P in the topology's terms, used to enrich a
    /// topology read from sysfs (which cannot see NVLinks). `None` when unavailable.
    fn nvml_snapshot(&self) -> Option<gdx_topo::enrich::NvmlSnapshot> {
        None
    }
}

/// Facts given up front: for tests, and for replaying facts saved from another run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaticFacts {
    /// CUDA.
    pub cuda: Result<CudaFacts, Unavailable>,
    /// NVML.
    pub nvml: Result<NvmlFacts, Unavailable>,
    /// libibverbs.
    pub verbs: Result<VerbsFacts, Unavailable>,
    /// cuFile.
    pub cufile: Result<CufileFacts, Unavailable>,
    /// NVML snapshot for topology enrichment.
    pub nvml_snapshot: Option<gdx_topo::enrich::NvmlSnapshot>,
}

impl StaticFacts {
    /// Every library "not queried": the neutral starting point tests fill in.
    pub fn none() -> Self {
        StaticFacts {
            cuda: Err(Unavailable::not_queried("libcuda.so.1", "not provided")),
            nvml: Err(Unavailable::not_queried(
                "libnvidia-ml.so.1",
                "not provided",
            )),
            verbs: Err(Unavailable::not_queried("libibverbs.so.1", "not provided")),
            cufile: Err(Unavailable::not_queried("libcufile.so.0", "not provided")),
            nvml_snapshot: None,
        }
    }
}

impl LiveFacts for StaticFacts {
    fn cuda(&self) -> Result<CudaFacts, Unavailable> {
        self.cuda.clone()
    }
    fn nvml(&self) -> Result<NvmlFacts, Unavailable> {
        self.nvml.clone()
    }
    fn verbs(&self) -> Result<VerbsFacts, Unavailable> {
        self.verbs.clone()
    }
    fn cufile(&self) -> Result<CufileFacts, Unavailable> {
        self.cufile.clone()
    }
    fn nvml_snapshot(&self) -> Option<gdx_topo::enrich::NvmlSnapshot> {
        self.nvml_snapshot.clone()
    }
}

/// The facts gathered once per run, as the checks see them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gathered {
    /// CUDA.
    pub cuda: Result<CudaFacts, Unavailable>,
    /// NVML.
    pub nvml: Result<NvmlFacts, Unavailable>,
    /// libibverbs.
    pub verbs: Result<VerbsFacts, Unavailable>,
    /// cuFile.
    pub cufile: Result<CufileFacts, Unavailable>,
}

impl Gathered {
    /// Ask every library once.
    pub fn from(source: &dyn LiveFacts) -> Self {
        Gathered {
            cuda: source.cuda(),
            nvml: source.nvml(),
            verbs: source.verbs(),
            cufile: source.cufile(),
        }
    }

    /// The CUDA device at a PCI address.
    pub fn cuda_device(&self, bdf: PciAddr) -> Option<&CudaDevice> {
        self.cuda
            .as_ref()
            .ok()?
            .devices
            .iter()
            .find(|d| d.bdf == Some(bdf))
    }

    /// The NVML device at a PCI address.
    pub fn nvml_device(&self, bdf: PciAddr) -> Option<&NvmlDevice> {
        self.nvml
            .as_ref()
            .ok()?
            .devices
            .iter()
            .find(|d| d.bdf == Some(bdf))
    }
}
