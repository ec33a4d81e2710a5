//! One CUDA device: name, PCI bus id, memory, compute capability and the attributes gdx checks
//! (GPUDirect RDMA, DMA-BUF, memory pools, ...).

use super::api::{CuDevice, CuUuid};
use super::{Cuda, CudaError};
use cudarc::driver::sys::CUdevice_attribute as A;
use std::ffi::{c_char, c_int, CStr};
use std::fmt;

/// A CUDA device (`CUdevice`) of a loaded driver. Holds the driver handle.
#[derive(Debug, Clone)]
pub struct Device {
    cuda: Cuda,
    ordinal: u32,
    raw: CuDevice,
}

/// A compute capability, e.g. 9.0 for Hopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    /// `9.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

macro_rules! attributes {
    ($( $(#[doc = $doc:literal])* $variant:ident => $cu:ident, )*) => {
        /// A device attribute gdx queries (`CUdevice_attribute`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Attribute {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Attribute {
            /// The `CU_DEVICE_ATTRIBUTE_*` name.
            pub fn cu_name(self) -> &'static str {
                match self {
                    $( Attribute::$variant => stringify!($cu), )*
                }
            }

            /// The numeric `CUdevice_attribute` value (CUDA 13.0 headers).
            pub fn raw(self) -> i32 {
                match self {
                    $( Attribute::$variant => A::$cu as i32, )*
                }
            }
        }
    };
}

attributes! {
    /// Compute capability, major part.
    ComputeCapabilityMajor => CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    /// Compute capability, minor part.
    ComputeCapabilityMinor => CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    /// Number of streaming multiprocessors.
    MultiprocessorCount => CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    /// Number of asynchronous copy engines.
    AsyncEngineCount => CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
    /// Unified virtual addressing with the host.
    UnifiedAddressing => CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
    /// PCI domain of the device.
    PciDomainId => CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
    /// PCI bus of the device.
    PciBusId => CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
    /// PCI device (slot) of the device.
    PciDeviceId => CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
    /// GPUDirect RDMA: a NIC can DMA to and from this GPU's memory.
    GpuDirectRdmaSupported => CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
    /// GPUDirect RDMA on memory from the virtual memory management API (`cuMemCreate`).
    GpuDirectRdmaWithCudaVmmSupported => CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
    /// Bitmask of `CUflushGPUDirectRDMAWritesOptions`.
    GpuDirectRdmaFlushWritesOptions => CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
    /// `CUGPUDirectRDMAWritesOrdering` of the device.
    GpuDirectRdmaWritesOrdering => CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
    /// Device memory can be exported as a DMA-BUF file descriptor (`cuMemGetHandleForAddressRange`).
    DmaBufSupported => CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    /// Stream-ordered memory pools (`cuMemAllocAsync`).
    MemoryPoolsSupported => CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
    /// Virtual memory management (`cuMemCreate`, `cuMemMap`).
    VirtualMemoryManagementSupported => CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    /// POSIX file descriptors as shareable handles for `cuMemCreate` allocations.
    HandleTypePosixFileDescriptorSupported => CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    /// The device can map page-locked host memory into its address space.
    CanMapHostMemory => CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
    /// 64-bit stream memory operations (`cuStreamWriteValue64`, `cuStreamWaitValue64`).
    CanUse64BitStreamMemOps => CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
    /// `CU_STREAM_WAIT_VALUE_NOR` in stream memory operations.
    CanUseStreamWaitValueNor => CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR,
    /// `CU_STREAM_WAIT_VALUE_FLUSH` (flush remote writes after a wait).
    CanFlushRemoteWrites => CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES,
    /// NUMA node of the device memory, or -1.
    NumaId => CU_DEVICE_ATTRIBUTE_NUMA_ID,
    /// NUMA node of the host CPU closest to the device, or -1.
    HostNumaId => CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
}

/// What [`Device::info`] gathers about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: u32,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// UUID in NVML's form (`GPU-xxxxxxxx-...`); `None` when the driver lacks `cuDeviceGetUuid`.
    pub uuid: Option<String>,
    /// PCI bus id as the driver gives it, e.g. `0000:06:00.0`.
    pub pci_bus_id: String,
    /// Total device memory in bytes.
    pub total_memory_bytes: u64,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// [`Attribute::GpuDirectRdmaSupported`]; `None` when the query failed.
    pub gpu_direct_rdma: Option<bool>,
    /// [`Attribute::DmaBufSupported`]; `None` when the query failed.
    pub dma_buf: Option<bool>,
    /// [`Attribute::MemoryPoolsSupported`]; `None` when the query failed.
    pub memory_pools: Option<bool>,
}

impl Device {
    pub(super) fn new(cuda: Cuda, ordinal: u32, raw: CuDevice) -> Self {
        Device { cuda, ordinal, raw }
    }

    /// CUDA ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The loaded driver this device belongs to.
    pub fn cuda(&self) -> &Cuda {
        &self.cuda
    }

    pub(super) fn raw(&self) -> CuDevice {
        self.raw
    }

    fn check(&self, status: u32, call: impl Into<String>) -> Result<(), CudaError> {
        self.cuda.check(status, call, Some(self.ordinal))
    }

    /// Product name (`cuDeviceGetName`).
    pub fn name(&self) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is writable for its full length, which is passed as the limit.
        let status = unsafe {
            (self.cuda.api().cuDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, self.raw)
        };
        self.check(status, "cuDeviceGetName")?;
        Ok(c_buf_to_string(&buf))
    }

    /// PCI bus id, `domain:bus:device.function` (`cuDeviceGetPCIBusId`).
    pub fn pci_bus_id(&self) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` is writable for its full length, which is passed as the limit.
        let status = unsafe {
            (self.cuda.api().cuDeviceGetPCIBusId)(buf.as_mut_ptr(), buf.len() as c_int, self.raw)
        };
        self.check(status, "cuDeviceGetPCIBusId")?;
        Ok(c_buf_to_string(&buf))
    }

    /// Total device memory in bytes (`cuDeviceTotalMem_v2`).
    pub fn total_memory_bytes(&self) -> Result<u64, CudaError> {
        let mut bytes: usize = 0;
        // SAFETY: `bytes` is a valid out-pointer for one size_t.
        let status = unsafe { (self.cuda.api().cuDeviceTotalMem_v2)(&mut bytes, self.raw) };
        self.check(status, "cuDeviceTotalMem_v2")?;
        Ok(bytes as u64)
    }

    /// UUID in NVML's text form, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
    /// (`cuDeviceGetUuid_v2`, else `cuDeviceGetUuid`); `None` when the driver has neither.
    pub fn uuid(&self) -> Result<Option<String>, CudaError> {
        let api = self.cuda.api();
        let (f, call) = match (api.cuDeviceGetUuid_v2, api.cuDeviceGetUuid) {
            (Some(f), _) => (f, "cuDeviceGetUuid_v2"),
            (None, Some(f)) => (f, "cuDeviceGetUuid"),
            (None, None) => return Ok(None),
        };
        let mut uuid = CuUuid::default();
        // SAFETY: `uuid` is a valid out-pointer for one 16-byte CUuuid.
        let status = unsafe { f(&mut uuid, self.raw) };
        self.check(status, call)?;
        Ok(Some(format_uuid(&uuid.bytes)))
    }

    /// The value of `attribute` (`cuDeviceGetAttribute`).
    pub fn attribute(&self, attribute: Attribute) -> Result<i32, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; an attribute the driver does not know is
        // reported with CUDA_ERROR_INVALID_VALUE, not undefined behaviour.
        let status =
            unsafe { (self.cuda.api().cuDeviceGetAttribute)(&mut v, attribute.raw(), self.raw) };
        self.check(
            status,
            format!("cuDeviceGetAttribute({})", attribute.cu_name()),
        )?;
        Ok(v)
    }

    /// Compute capability (two attribute queries).
    pub fn compute_capability(&self) -> Result<ComputeCapability, CudaError> {
        let major = self.attribute(Attribute::ComputeCapabilityMajor)?;
        let minor = self.attribute(Attribute::ComputeCapabilityMinor)?;
        Ok(ComputeCapability {
            major: u32::try_from(major).unwrap_or(0),
            minor: u32::try_from(minor).unwrap_or(0),
        })
    }

    /// [`Attribute::GpuDirectRdmaSupported`] as a flag.
    pub fn gpu_direct_rdma_supported(&self) -> Result<bool, CudaError> {
        Ok(self.attribute(Attribute::GpuDirectRdmaSupported)? != 0)
    }

    /// [`Attribute::DmaBufSupported`] as a flag.
    pub fn dma_buf_supported(&self) -> Result<bool, CudaError> {
        Ok(self.attribute(Attribute::DmaBufSupported)? != 0)
    }

    /// [`Attribute::MemoryPoolsSupported`] as a flag.
    pub fn memory_pools_supported(&self) -> Result<bool, CudaError> {
        Ok(self.attribute(Attribute::MemoryPoolsSupported)? != 0)
    }

    /// Whether this device can map `peer`'s memory (`cuDeviceCanAccessPeer`).
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool, CudaError> {
        let mut can: c_int = 0;
        // SAFETY: `can` is a valid out-pointer; both handles came from `cuDeviceGet`.
        let status =
            unsafe { (self.cuda.api().cuDeviceCanAccessPeer)(&mut can, self.raw, peer.raw) };
        self.check(status, "cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    /// Name, UUID, PCI bus id, memory, compute capability and the GPUDirect RDMA, DMA-BUF and
    /// memory-pool flags. Fails only when one of the first four queries fails; an attribute
    /// query that fails (an older driver) leaves its flag `None`.
    pub fn info(&self) -> Result<DeviceInfo, CudaError> {
        let flag = |r: Result<bool, CudaError>| match r {
            Ok(b) => Some(b),
            Err(e) => {
                log::debug!("{e}");
                None
            }
        };
        Ok(DeviceInfo {
            ordinal: self.ordinal,
            name: self.name()?,
            uuid: self.uuid()?,
            pci_bus_id: self.pci_bus_id()?,
            total_memory_bytes: self.total_memory_bytes()?,
            compute_capability: self.compute_capability()?,
            gpu_direct_rdma: flag(self.gpu_direct_rdma_supported()),
            dma_buf: flag(self.dma_buf_supported()),
            memory_pools: flag(self.memory_pools_supported()),
        })
    }
}

/// The text before the first NUL of a C buffer (the whole buffer when there is none).
fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `GPU-` and the 16 bytes as 8-4-4-4-12 hex digits, NVML's form.
pub(crate) fn format_uuid(b: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_matches_nvml_form() {
        let b = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(format_uuid(&b), "GPU-12345678-9abc-def0-0123-456789abcdef");
    }

    #[test]
    fn c_buffers_stop_at_the_first_nul() {
        let mut buf = [0 as c_char; 8];
        for (i, c) in b"H200".iter().enumerate() {
            buf[i] = *c as c_char;
        }
        buf[6] = b'x' as c_char;
        assert_eq!(c_buf_to_string(&buf), "H200");
        let full = [b'a' as c_char; 3];
        assert_eq!(c_buf_to_string(&full), "aaa");
    }

    #[test]
    fn attribute_numbers_match_cuda_h() {
        // Values from cuda.h (CUDA 13.0); a wrong mapping would query another attribute.
        assert_eq!(Attribute::ComputeCapabilityMajor.raw(), 75);
        assert_eq!(Attribute::MemoryPoolsSupported.raw(), 115);
        assert_eq!(Attribute::GpuDirectRdmaSupported.raw(), 116);
        assert_eq!(Attribute::DmaBufSupported.raw(), 124);
        assert_eq!(Attribute::CanMapHostMemory.raw(), 19);
        assert_eq!(Attribute::CanFlushRemoteWrites.raw(), 98);
        assert_eq!(Attribute::CanUse64BitStreamMemOps.raw(), 122);
        assert_eq!(Attribute::CanUseStreamWaitValueNor.raw(), 123);
        assert_eq!(
            Attribute::DmaBufSupported.cu_name(),
            "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"
        );
    }
}
