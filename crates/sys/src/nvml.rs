//! NVML: GPU names, UUIDs, NVLinks, BAR1, P2P status. (STUB — being written.)

use crate::Unavailable;

/// What is at the far end of an NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    /// A GPU, by PCI bus id text.
    Gpu(String),
    /// An NVSwitch.
    Switch,
    /// A CPU.
    Cpu,
}

/// One active NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Link number.
    pub link: u32,
    /// Far end.
    pub remote: Remote,
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: Option<String>,
    /// UUID.
    pub uuid: Option<String>,
    /// PCI bus id text as NVML gives it.
    pub bdf: String,
    /// BAR1 total bytes.
    pub bar1_bytes: Option<u64>,
    /// Memory total bytes.
    pub memory_bytes: Option<u64>,
    /// "major.minor".
    pub compute_capability: Option<String>,
    /// Active NVLinks.
    pub nvlinks: Vec<Link>,
    /// (peer bus id, P2P read status text).
    pub p2p_read: Vec<(String, String)>,
}

/// All GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Driver version.
    pub driver_version: Option<String>,
    /// CUDA driver version number.
    pub cuda_driver_version: Option<i32>,
    /// GPUs in NVML order.
    pub gpus: Vec<Gpu>,
}

/// Query NVML. STUB.
pub fn snapshot() -> Result<Snapshot, Unavailable> {
    Err(Unavailable {
        library: "libnvidia-ml.so.1".into(),
        reason: "not implemented yet".into(),
    })
}
