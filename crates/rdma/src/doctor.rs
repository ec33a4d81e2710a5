//! What `gdx doctor` calls for its RDMA checks. Everything returns data, never text for a
//! terminal, and never panics when libibverbs or a device is missing.
//!
//! | check | call |
//! |---|---|
//! | `rdma-devices` | [`rdma_devices`] (libibverbs), or `Topology` NICs for a `--root` |
//! | `dmabuf` | [`has_reg_dmabuf_mr`] + [`dmabuf_kernel_support`] per device |
//! | `roce-gid` | [`roce_gids`] (sysfs GID tables, works under `--root`) |
//! | `mtu` | [`port_mtus`] (verbs active/max MTU + netdev MTU from sysfs) |
//! | active probe | [`probe_gpu_registration`] (registers a GPU buffer on each NIC) |

use crate::cache::Registrar;
use crate::discovery::{self, RdmaUnavailable};
use crate::error::RdmaError;
use crate::gid::{self, GidCandidate, GidChoice, GidError, LinkKind, NetdevView};
use crate::register::{Mechanism, Memory, RegPolicy, VerbsRegistrar};
pub use gdx_sys::verbs::{dmabuf_kernel_support, DmabufSupport};
use gdx_sys::verbs::{Access, RdmaContext, VerbsDevice};
use gdx_topo::Topology;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

/// RDMA devices through the real libibverbs, or why there are none.
pub fn rdma_devices() -> Result<Vec<VerbsDevice>, RdmaUnavailable> {
    discovery::discover()
}

/// Whether the loaded libibverbs exports `ibv_reg_dmabuf_mr` (rdma-core ≥ v34); `None` when
/// libibverbs is unavailable.
pub fn has_reg_dmabuf_mr() -> Option<bool> {
    gdx_sys::verbs::probe().ok().map(|l| l.has_reg_dmabuf_mr)
}

/// The GID choice for one port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortGid {
    /// RDMA device.
    pub device: String,
    /// Port number.
    pub port: u32,
    /// Link layer.
    pub link: LinkKind,
    /// Port state text from sysfs, e.g. `4: ACTIVE`.
    pub state: Option<String>,
    /// The populated GID table.
    pub gids: Vec<GidCandidate>,
    /// The GID gdx would use, or why none.
    #[serde(serialize_with = "ser_choice")]
    pub choice: Result<GidChoice, GidError>,
}

fn ser_choice<S: serde::Serializer>(
    c: &Result<GidChoice, GidError>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(1))?;
    match c {
        Ok(g) => m.serialize_entry("ok", g)?,
        Err(e) => m.serialize_entry("error", &e.to_string())?,
    }
    m.end()
}

/// GID choice for every port of every RDMA NIC in `topo` (sysfs GID tables, so this works on
/// a captured `--root`), with `GDX_IB_GID_INDEX` honoured (a bad value is reported per port).
pub fn roce_gids(topo: &Topology, netdevs: &dyn NetdevView) -> Vec<PortGid> {
    let over = gid::override_from_env();
    let mut out = Vec::new();
    for nic in topo.nics() {
        let Some(info) = &nic.nic else { continue };
        let Some(name) = &info.rdma_name else {
            continue;
        };
        for p in &info.ports {
            let choice = match &over {
                Err(e) => Err(e.clone()),
                Ok(o) => gid::select_gid_for_port(name, p, netdevs, *o),
            };
            out.push(PortGid {
                device: name.clone(),
                port: p.port,
                link: LinkKind::from_text(p.link_layer.as_deref()),
                state: p.state.clone(),
                gids: gid::candidates_from_topo(p),
                choice,
            });
        }
    }
    out
}

/// The MTUs of one port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortMtu {
    /// RDMA device.
    pub device: String,
    /// Port number.
    pub port: u32,
    /// Link layer.
    pub link: LinkKind,
    /// Verbs active MTU in bytes.
    pub active_mtu: Option<u32>,
    /// Verbs largest MTU in bytes.
    pub max_mtu: Option<u32>,
    /// The RoCE netdev and its MTU (from `sys/class/net/<if>/mtu`).
    pub netdev: Option<(String, Option<u32>)>,
    /// The verbs MTU the netdev MTU allows on RoCE (what the active MTU should be).
    pub roce_mtu_for_netdev: Option<u32>,
}

/// The RoCE (verbs) MTU a netdev MTU allows: the largest of 256..4096 that fits after the
/// RoCE headers (as the kernel's `iboe_get_mtu`: GRH 40 + BTH 12 + XRC 4 + AtomicETH 28 +
/// ICRC 4 = 88 bytes). 1500 → 1024, 9000 → 4096.
pub fn roce_mtu_for_netdev(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(88)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| *m <= room)
}

/// Active/max MTU of every port of `devices` (from [`rdma_devices`]), with the RoCE netdev's
/// MTU read under `root`.
pub fn port_mtus(devices: &[VerbsDevice], root: &Path) -> Vec<PortMtu> {
    let mut out = Vec::new();
    for d in devices {
        for p in &d.ports {
            let link = LinkKind::from_text(Some(&p.link_layer.to_string()));
            let netdev = (link == LinkKind::Ethernet)
                .then(|| p.gids.iter().find_map(|g| g.netdev.clone()))
                .flatten()
                .map(|n| {
                    let mtu =
                        std::fs::read_to_string(root.join("sys/class/net").join(&n).join("mtu"))
                            .ok()
                            .and_then(|s| s.trim().parse().ok());
                    (n, mtu)
                });
            let roce = netdev
                .as_ref()
                .and_then(|(_, m)| m.and_then(roce_mtu_for_netdev));
            out.push(PortMtu {
                device: d.name.clone(),
                port: u32::from(p.number),
                link,
                active_mtu: p.active_mtu_bytes,
                max_mtu: p.max_mtu_bytes,
                netdev,
                roce_mtu_for_netdev: roce,
            });
        }
    }
    out
}

/// What registering a GPU buffer on one NIC did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicRegProbe {
    /// RDMA device.
    pub device: String,
    /// GPU ordinal.
    pub gpu: u32,
    /// Buffer size.
    pub bytes: u64,
    /// dma-buf: `Ok` or why not.
    pub dmabuf: Result<(), String>,
    /// peermem: `Ok` or why not.
    pub peermem: Result<(), String>,
    /// The mechanism gdx would use (dma-buf preferred), `None` when neither works.
    pub worked: Option<Mechanism>,
}

/// The active probe: allocate `bytes` on GPU `gpu` and register it on every RDMA device
/// with dma-buf and with peermem separately, reporting which worked.
pub fn probe_gpu_registration(gpu: u32, bytes: usize) -> Result<Vec<NicRegProbe>, RdmaError> {
    use gdx_sys::cuda::{Context, Cuda, DeviceBuffer};
    let devices = discovery::discover()?;
    let cuda = Cuda::load().map_err(|u| RdmaError::InvalidArgument(u.to_string()))?;
    let ctx = Context::new(&cuda.device(gpu)?)?;
    let buf = Arc::new(DeviceBuffer::new(&ctx, bytes)?);
    let mut out = Vec::new();
    for d in devices {
        let rctx = match RdmaContext::open(&d.name) {
            Ok(c) => c,
            Err(e) => {
                out.push(NicRegProbe {
                    device: d.name.clone(),
                    gpu,
                    bytes: bytes as u64,
                    dmabuf: Err(e.to_string()),
                    peermem: Err(e.to_string()),
                    worked: None,
                });
                continue;
            }
        };
        let try_one = |dmabuf: bool| -> Result<(), String> {
            let r = VerbsRegistrar::new(
                rctx.clone(),
                RegPolicy {
                    strict: true,
                    dmabuf,
                    peermem: !dmabuf,
                    access: Access::ALL,
                },
            );
            r.register(&Memory::gpu(Arc::clone(&buf)))
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let dmabuf = try_one(true);
        let peermem = try_one(false);
        let worked = if dmabuf.is_ok() {
            Some(Mechanism::DmaBuf)
        } else if peermem.is_ok() {
            Some(Mechanism::PeerMem)
        } else {
            None
        };
        out.push(NicRegProbe {
            device: d.name,
            gpu,
            bytes: bytes as u64,
            dmabuf,
            peermem,
            worked,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_mtu_to_roce_mtu() {
        assert_eq!(roce_mtu_for_netdev(1500), Some(1024));
        assert_eq!(roce_mtu_for_netdev(9000), Some(4096));
        assert_eq!(roce_mtu_for_netdev(4200), Some(4096));
        assert_eq!(roce_mtu_for_netdev(4000), Some(2048));
        assert_eq!(roce_mtu_for_netdev(100), None);
    }

    #[test]
    fn without_devices_every_call_answers() {
        // On a machine without RDMA (CI, this one) these must return, typed, not panic.
        match rdma_devices() {
            Ok(d) => assert!(!d.is_empty()),
            Err(e) => assert!(!e.reason.is_empty()),
        }
        let _ = has_reg_dmabuf_mr();
        assert!(matches!(
            dmabuf_kernel_support("gdx_no_such_device"),
            DmabufSupport::Error(_)
        ));
    }
}
