//! libibverbs: RDMA devices, their ports and GID tables, through sideway.
//!
//! How the library is reached: sideway calls rdma-mummy-sys, which links a small static shim
//! (no link-time dependency on libibverbs). The shim's constructor runs
//! `dlopen("libibverbs.so.1")` at process start and leaves every function pointer null when
//! that fails; a call through a null pointer then returns its failure value with
//! `errno = EOPNOTSUPP` (no panic, no abort). So [`probe`] opens the same soname itself and
//! checks the symbols, and only then does [`devices`] call through the shim, where a null
//! device list with `ENOSYS` or `EOPNOTSUPP` means "no RDMA devices".
//!
//! [`register_gpu_memory`] registers GPU memory with an RDMA device (dma-buf or peermem) through
//! sideway's protection domain and memory region.
//!
//! The data path's objects are owned here, each releasing its handle on drop and logging (never
//! panicking) when that fails: [`RdmaContext`] (device + protection domain, sideway's types),
//! [`MemoryRegion`] (`ibv_reg_mr` / `ibv_reg_dmabuf_mr`), [`CompletionQueue`] and [`QueuePair`]
//! (raw calls: sideway's completion and queue-pair types panic on unknown codes and on a failed
//! destroy). [`RdmaContext::dmabuf_probe`] / [`dmabuf_kernel_support`] run NCCL's kernel-side
//! dma-buf probe; [`interface_addresses`] lists the IP addresses RoCE GIDs are matched against.
//!
//! sideway's port, speed, MTU and GID-type conversions panic on values they do not know, so
//! ports and GIDs are queried here with the raw calls and converted by this module's own
//! total functions (`port`).

mod context;
mod cq;
mod error;
mod mr;
mod netdev;
mod port;
mod qp;
mod register;

pub use context::{dmabuf_kernel_support, DeviceCaps, DmabufSupport, RdmaContext};
pub use cq::{wc_status_str, CompletionQueue, WorkCompletion};
pub use error::{Errno, VerbsError};
pub use mr::{Access, MemoryRegion};
pub use netdev::{interface_addresses, InterfaceAddress};
pub use port::{GidEntry, GidType, LinkLayer, Port, PortState};
pub use qp::{mtu_code, PostError, QpCaps, QueuePair, RdmaOp, RtrAttr, RtsAttr, SendWr};
pub use register::{register_gpu_memory, GpuRegistration, RegMethod, RegisterError};

use crate::loader;
use crate::Unavailable;
use sideway::ibverbs::device::{DeviceInfo, DeviceList, GetDeviceListErrorKind};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// Soname of libibverbs; the only name rdma-mummy-sys opens.
pub const SONAME: &str = "libibverbs.so.1";

/// The libibverbs that [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsLibrary {
    /// The file the loader mapped, e.g. `/lib/x86_64-linux-gnu/libibverbs.so.1`.
    pub path: String,
    /// rdma-core release read from the real file name (`libibverbs.so.1.14.50.0` is rdma-core
    /// 50.0); `None` when the name does not have that form.
    pub rdma_core_version: Option<String>,
    /// Whether the library exports `ibv_reg_dmabuf_mr` (rdma-core v34 and later).
    pub has_reg_dmabuf_mr: bool,
}

/// One RDMA device.
#[derive(Debug, Clone, PartialEq)]
pub struct VerbsDevice {
    /// Device name, e.g. `mlx5_0`.
    pub name: String,
    /// Node GUID, `xxxx:xxxx:xxxx:xxxx` as `ibv_devinfo` prints it.
    pub guid: String,
    /// Firmware version; `None` when the device could not be queried.
    pub firmware: Option<String>,
    /// PCI vendor id; `None` when the device could not be queried.
    pub vendor_id: Option<u32>,
    /// Vendor part id; `None` when the device could not be queried.
    pub vendor_part_id: Option<u32>,
    /// Physical ports, numbered from 1.
    pub ports: Vec<Port>,
    /// Why the device could not be opened or queried, if so (the fields above stay empty).
    pub error: Option<String>,
}

/// Check that `libibverbs.so.1` opens and has the verbs gdx uses; cached like the other
/// loaders.
pub fn probe() -> Result<VerbsLibrary, Unavailable> {
    static PROBE: OnceLock<Result<VerbsLibrary, Unavailable>> = OnceLock::new();
    PROBE.get_or_init(|| probe_from(&[SONAME])).clone()
}

/// Whether [`probe`] succeeds.
pub fn is_available() -> bool {
    probe().is_ok()
}

/// Check an explicit candidate list, bypassing the cache. This only checks a file: the device
/// queries always go through the `libibverbs.so.1` rdma-mummy-sys opened at start.
pub fn probe_from<S: AsRef<str>>(candidates: &[S]) -> Result<VerbsLibrary, Unavailable> {
    let opened = loader::open_first(SONAME, candidates)?;
    // SAFETY: the table's prototypes copy verbs.h, with struct pointers as `*mut c_void`; the
    // functions are only looked up here, never called through this table.
    let table =
        unsafe { Probe::resolve(&opened) }.map_err(|m| m.into_unavailable(SONAME, &opened))?;
    let path = opened.file(table.ibv_get_device_list as *const c_void);
    let rdma_core_version = std::fs::canonicalize(&path)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .and_then(|n| rdma_core_version(&n));
    Ok(VerbsLibrary {
        path,
        rdma_core_version,
        has_reg_dmabuf_mr: table.ibv_reg_dmabuf_mr.is_some(),
    })
}

/// Whether the cached libibverbs ([`probe`]) exports `ibv_reg_dmabuf_mr`; false when
/// libibverbs is unavailable. Without it, rdma-mummy-sys's shim answers every dma-buf
/// registration with `EOPNOTSUPP`, which must not be mistaken for the kernel's answer.
pub fn has_reg_dmabuf_mr() -> bool {
    probe().is_ok_and(|l| l.has_reg_dmabuf_mr)
}

loader::fn_table! {
    /// The verbs [`devices`] reaches through rdma-mummy-sys.
    struct Probe {
        ibv_get_device_list: fn(*mut c_int) -> *mut *mut c_void;
        ibv_free_device_list: fn(*mut *mut c_void) -> ();
        ibv_get_device_name: fn(*mut c_void) -> *const std::ffi::c_char;
        ibv_get_device_guid: fn(*mut c_void) -> u64;
        ibv_open_device: fn(*mut c_void) -> *mut c_void;
        ibv_close_device: fn(*mut c_void) -> c_int;
        ibv_query_port: fn(*mut c_void, u8, *mut c_void) -> c_int;
        ibv_query_gid: fn(*mut c_void, u8, c_int, *mut c_void) -> c_int;
    }
    optional {
        ibv_reg_dmabuf_mr: fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut c_void;
    }
}

/// `50.0` from `libibverbs.so.1.14.50.0`.
fn rdma_core_version(file_name: &str) -> Option<String> {
    let rest = file_name.strip_prefix("libibverbs.so.")?;
    let parts: Vec<&str> = rest.split('.').collect();
    match parts.as_slice() {
        [_, _, major, minor] if parts.iter().all(|p| p.parse::<u32>().is_ok()) => {
            Some(format!("{major}.{minor}"))
        }
        _ => None,
    }
}

/// Every RDMA device with its ports and GIDs. `Ok(vec![])` when libibverbs is present but
/// reports no devices (also when the kernel has no RDMA support: `ENOSYS`). A device that
/// cannot be opened or queried is listed with its `error`.
pub fn devices() -> Result<Vec<VerbsDevice>, Unavailable> {
    probe()?;
    let list = match DeviceList::new() {
        Ok(list) => list,
        Err(e) => {
            let errno = match &e.0 {
                GetDeviceListErrorKind::Ibverbs(io) => io.raw_os_error(),
                _ => None,
            };
            if matches!(errno, Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)) {
                return Ok(Vec::new());
            }
            let detail = match &e.0 {
                GetDeviceListErrorKind::Ibverbs(io) => io.to_string(),
                other => other.to_string(),
            };
            return Err(Unavailable::new(
                SONAME,
                format!("ibv_get_device_list failed: {detail}"),
            ));
        }
    };
    Ok(list.iter().map(|d| device(&d)).collect())
}

fn device(d: &sideway::ibverbs::device::Device<'_>) -> VerbsDevice {
    let name = d.name();
    let mut out = VerbsDevice {
        name: name.clone(),
        guid: format_guid(u64::from_be(d.guid().as_u64())),
        firmware: None,
        vendor_id: None,
        vendor_part_id: None,
        ports: Vec::new(),
        error: None,
    };
    let ctx = match d.open() {
        Ok(ctx) => ctx,
        Err(e) => {
            out.error = Some(format!(
                "ibv_open_device({name}) failed: {}",
                source_text(&e)
            ));
            return out;
        }
    };
    let attr = match ctx.query_device() {
        Ok(a) => a,
        Err(e) => {
            out.error = Some(format!(
                "ibv_query_device_ex({name}) failed: {}",
                source_text(&e)
            ));
            return out;
        }
    };
    out.firmware = Some(attr.firmware_version()).filter(|f| !f.is_empty());
    out.vendor_id = Some(attr.vendor_id());
    out.vendor_part_id = Some(attr.vendor_part_id());
    for p in 1..=attr.phys_port_cnt() {
        out.ports.push(port::query(&ctx, &name, p));
    }
    out
}

/// The message of an error and of its source, `a: b`.
fn source_text(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

/// `xxxx:xxxx:xxxx:xxxx` of a GUID in host order.
fn format_guid(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_listed_or_libibverbs_is_named() {
        match devices() {
            Ok(devs) => {
                eprintln!("{:?}: {devs:?}", probe());
                assert!(is_available());
                for d in devs {
                    assert!(!d.name.is_empty());
                    assert_eq!(d.guid.len(), 19, "{}", d.guid);
                }
            }
            Err(e) => {
                assert_eq!(e.library, "libibverbs.so.1");
                assert!(e.reason.contains("libibverbs.so.1"), "{}", e.reason);
                assert!(!is_available());
            }
        }
    }

    #[test]
    fn probe_is_cached() {
        assert_eq!(probe(), probe());
    }

    #[test]
    fn bogus_path_is_unavailable_naming_the_path() {
        let bogus = "/nonexistent/gdx/libibverbs.so.1";
        let e = probe_from(&[bogus]).unwrap_err();
        assert_eq!(e.library, "libibverbs.so.1");
        assert!(e.reason.contains(bogus), "{}", e.reason);
    }

    #[test]
    fn wrong_library_is_unavailable_naming_the_missing_symbols() {
        let e = probe_from(&["libc.so.6"]).unwrap_err();
        assert!(e.reason.contains("libc.so.6"), "{}", e.reason);
        assert!(e.reason.contains("ibv_get_device_list"), "{}", e.reason);
    }

    #[test]
    fn rdma_core_version_comes_from_the_file_name() {
        assert_eq!(
            rdma_core_version("libibverbs.so.1.14.50.0").as_deref(),
            Some("50.0")
        );
        assert_eq!(rdma_core_version("libibverbs.so.1"), None);
        assert_eq!(rdma_core_version("libibverbs.so.1.14.x.0"), None);
        assert_eq!(rdma_core_version("libc.so.6"), None);
    }

    #[test]
    fn guid_prints_like_ibv_devinfo() {
        // ibv_get_device_guid returns big-endian; on the wire 0x0c42a10300f1e2d3.
        let be = 0x0c42_a103_00f1_e2d3_u64.to_be();
        assert_eq!(format_guid(u64::from_be(be)), "0c42:a103:00f1:e2d3");
    }
}
