//! What `gdx doctor` calls for its RDMA checks. Everything returns data, never text for a
//! terminal, and never panics when libibverbs or a device is missing.
//!
//! | check | call |
//! |---|---|
//! | `rdma-devices` | [`rdma_devices`] (libibverbs), or `Topology` NICs for a `--root` |
//! | `dmabuf` | [`has_reg_dmabuf_mr`] + [`dmabuf_kernel_support`] per device |
//! | `roce-gid` | [`roce_gids_with`] (sysfs GID tables, works under `--root`; the doctor passes its own environment's `GDX_IB_GID_INDEX`) |
//! | `mtu` | [`port_mtus_at_root`] (sysfs ports and netdev MTU under `--root`, verbs active/max MTU when the caller has them); [`port_mtus`] for libibverbs devices |
//! | skip reasons | [`no_rdma_port_reason`] (no RDMA device in the kernel and why, or software-only devices) |
//! | active probe | [`probe_gpu_registration`] (registers a GPU buffer on each NIC) |
//!
//! Everything that reads under a root reads sysfs as the kernel lays it out (`/` or a
//! `gdx topo --capture` tree); a link that resolves outside the root is not followed.

use crate::cache::Registrar;
use crate::discovery::{self, RdmaUnavailable};
use crate::error::RdmaError;
use crate::gid::{self, GidCandidate, GidChoice, GidError, GidKind, LinkKind, NetdevView};
use crate::register::{Mechanism, Memory, RegPolicy, VerbsRegistrar};
pub use gdx_sys::verbs::{dmabuf_kernel_support, DmabufSupport};
use gdx_sys::verbs::{Access, RdmaContext, VerbsDevice};
use gdx_topo::sysfs::devices::rdma_dev_dir;
use gdx_topo::sysfs::RootFs;
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
    /// The port's network interface (RoCE): see [`roce_netdev`].
    pub netdev: Option<String>,
    /// The GID gdx would use, or why none.
    #[serde(serialize_with = "ser_choice")]
    pub choice: Result<GidChoice, GidError>,
}

impl PortGid {
    /// Whether the port is ACTIVE.
    pub fn is_active(&self) -> bool {
        state_is_active(self.state.as_deref())
    }

    /// The populated entry at `index`.
    pub fn gid(&self, index: u32) -> Option<&GidCandidate> {
        self.gids.iter().find(|g| g.index == index)
    }

    /// The lowest-index RoCE v2 GID that carries an IP address (IPv4-mapped or global IPv6):
    /// what NCCL and gdx send RoCE v2 traffic from. `None` means RoCE v2 connections cannot
    /// be made from this port.
    pub fn routable_v2(&self) -> Option<&GidCandidate> {
        self.gids.iter().find(|g| g.is_routable_v2())
    }
}

/// Whether a port state text is active: sysfs `4: ACTIVE`, verbs `PORT_ACTIVE`.
pub fn state_is_active(state: Option<&str>) -> bool {
    state.is_some_and(|s| s.contains("ACTIVE"))
}

/// The network interface of a RoCE port: the netdev of its first RoCE v2 GID, else of any
/// GID, else the first of `fallback` (the interfaces on the NIC's PCI function).
pub fn roce_netdev(gids: &[GidCandidate], fallback: &[String]) -> Option<String> {
    gids.iter()
        .filter(|g| g.kind == GidKind::RoceV2)
        .chain(gids.iter())
        .find_map(|g| g.netdev.clone())
        .or_else(|| fallback.first().cloned())
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
/// a captured `--root`), with `GDX_IB_GID_INDEX` from the process environment honoured (a
/// bad value is reported per port).
pub fn roce_gids(topo: &Topology, netdevs: &dyn NetdevView) -> Vec<PortGid> {
    roce_gids_with(topo, netdevs, gid::override_from_env())
}

/// [`roce_gids`] with the `GDX_IB_GID_INDEX` override given by the caller ([`gid::parse_override`]
/// of the value, `Ok(None)` when unset): the doctor passes the environment it examines,
/// which is not always its own.
pub fn roce_gids_with(
    topo: &Topology,
    netdevs: &dyn NetdevView,
    override_index: Result<Option<u32>, GidError>,
) -> Vec<PortGid> {
    let mut out = Vec::new();
    for nic in topo.nics() {
        let Some(info) = &nic.nic else { continue };
        let Some(name) = &info.rdma_name else {
            continue;
        };
        for p in &info.ports {
            let choice = match &override_index {
                Err(e) => Err(e.clone()),
                Ok(o) => gid::select_gid_for_port(name, p, netdevs, *o),
            };
            let gids = gid::candidates_from_topo(p);
            let link = LinkKind::from_text(p.link_layer.as_deref());
            let netdev = (link == LinkKind::Ethernet)
                .then(|| roce_netdev(&gids, &info.netdevs))
                .flatten();
            out.push(PortGid {
                device: name.clone(),
                port: p.port,
                link,
                state: p.state.clone(),
                gids,
                netdev,
                choice,
            });
        }
    }
    out
}

/// Why `topo` (read from sysfs under `root`) has no RDMA port to check, in words; `None`
/// when it has one. "no RDMA device: the kernel has none (...); this kernel has no RDMA stack
/// loaded", or devices the kernel lists that the sysfs tree does not show.
pub fn no_rdma_port_reason(topo: &Topology, root: &Path) -> Option<String> {
    let nics: Vec<(&String, usize)> = topo
        .nics()
        .filter_map(|n| {
            let i = n.nic.as_ref()?;
            Some((i.rdma_name.as_ref()?, i.ports.len()))
        })
        .collect();
    if nics.iter().any(|(_, ports)| *ports > 0) {
        return None;
    }
    if !nics.is_empty() {
        let names: Vec<&str> = nics.iter().map(|(n, _)| n.as_str()).collect();
        return Some(format!(
            "RDMA device(s) {} have no ports in sys/class/infiniband/*/ports",
            names.join(", ")
        ));
    }
    let kernel = discovery::kernel_devices(root);
    if kernel.is_empty() {
        return Some(format!(
            "no RDMA device: {}",
            discovery::explain_no_kernel_device(root)
        ));
    }
    Some(format!(
        "libibverbs lists {} but sys/class/infiniband under this root shows none",
        kernel.join(", ")
    ))
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
    /// Port state text: sysfs `4: ACTIVE` or verbs `PORT_ACTIVE`.
    pub state: Option<String>,
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

impl PortMtu {
    /// Whether the port is ACTIVE.
    pub fn is_active(&self) -> bool {
        state_is_active(self.state.as_deref())
    }

    /// The path MTU this port runs: the verbs active MTU when known, else (RoCE) what the
    /// netdev MTU allows.
    pub fn effective_mtu(&self) -> Option<u32> {
        self.active_mtu.or(self.roce_mtu_for_netdev)
    }
}

/// A plain interface name (no path separators or dot names).
fn plain_name(n: &str) -> bool {
    !n.is_empty() && !n.contains('/') && !n.starts_with('.')
}

/// A netdev's MTU from `sys/class/net/<netdev>/mtu` under `root`; `None` when unreadable.
pub fn netdev_mtu(root: &Path, netdev: &str) -> Option<u32> {
    if !plain_name(netdev) {
        return None;
    }
    // Through topo's sysfs layer: `sys/class/net/<if>` is a link, absolute in some captures,
    // and must be followed inside the root, never on this machine.
    RootFs::new(root)
        .text(&format!("sys/class/net/{netdev}/mtu"))?
        .parse()
        .ok()
}

/// The interfaces on an RDMA device's PCI function (`sys/class/infiniband/<dev>/device/net`
/// under `root`), sorted.
fn device_netdevs(root: &Path, device: &str) -> Vec<String> {
    if !plain_name(device) {
        return Vec::new();
    }
    // Natural order, as `names_or_empty` lists them.
    RootFs::new(root)
        .names_or_empty(&format!("{}/device/net", rdma_dev_dir(device)))
        .into_iter()
        .filter(|n| plain_name(n))
        .collect()
}

fn port_mtu(
    device: &str,
    port: u32,
    link: LinkKind,
    state: Option<String>,
    verbs: (Option<u32>, Option<u32>),
    netdev: Option<String>,
    root: &Path,
) -> PortMtu {
    let netdev = netdev.map(|n| {
        let mtu = netdev_mtu(root, &n);
        (n, mtu)
    });
    let roce = netdev
        .as_ref()
        .and_then(|(_, m)| m.and_then(roce_mtu_for_netdev));
    PortMtu {
        device: device.to_string(),
        port,
        link,
        state,
        active_mtu: verbs.0,
        max_mtu: verbs.1,
        netdev,
        roce_mtu_for_netdev: roce,
    }
}

/// Active/max MTU of every port of `devices` (from [`rdma_devices`]), with the RoCE netdev's
/// MTU read under `root`.
pub fn port_mtus(devices: &[VerbsDevice], root: &Path) -> Vec<PortMtu> {
    let mut out = Vec::new();
    for d in devices {
        for p in &d.ports {
            let link = LinkKind::from_text(Some(&p.link_layer.to_string()));
            let netdev = (link == LinkKind::Ethernet)
                .then(|| roce_netdev(&gid::candidates_from_verbs(p), &[]))
                .flatten();
            out.push(port_mtu(
                &d.name,
                u32::from(p.number),
                link,
                Some(p.state.to_string()),
                (p.active_mtu_bytes, p.max_mtu_bytes),
                netdev,
                root,
            ));
        }
    }
    out
}

/// Verbs `(active_mtu, max_mtu)` in bytes of `(device, port)`, where the caller has them.
pub type VerbsMtuLookup<'a> = dyn Fn(&str, u32) -> (Option<u32>, Option<u32>) + 'a;

/// The MTUs of every port of every RDMA NIC in `topo`, read from sysfs under `root` (`/` or a
/// captured `--root`): state and link layer from the topology, the RoCE netdev
/// ([`roce_netdev`], falling back to the interfaces on the NIC's PCI function) and its MTU.
/// `verbs(device, port)` gives the verbs `(active_mtu, max_mtu)` in bytes where the caller
/// has them (libibverbs on the live machine); return `(None, None)` otherwise.
pub fn port_mtus_at_root(topo: &Topology, root: &Path, verbs: &VerbsMtuLookup<'_>) -> Vec<PortMtu> {
    let mut out = Vec::new();
    for nic in topo.nics() {
        let Some(info) = &nic.nic else { continue };
        let Some(name) = &info.rdma_name else {
            continue;
        };
        for p in &info.ports {
            let link = LinkKind::from_text(p.link_layer.as_deref());
            let netdev = (link == LinkKind::Ethernet)
                .then(|| {
                    let mut fallback = info.netdevs.clone();
                    fallback.extend(device_netdevs(root, name));
                    roce_netdev(&gid::candidates_from_topo(p), &fallback)
                })
                .flatten();
            out.push(port_mtu(
                name,
                p.port,
                link,
                p.state.clone(),
                verbs(name, p.port),
                netdev,
                root,
            ));
        }
    }
    out
}

/// What registering a GPU buffer on one NIC did.
#[derive(Debug, Clone, Serialize)]
pub struct NicRegProbe {
    /// RDMA device.
    pub device: String,
    /// GPU ordinal.
    pub gpu: u32,
    /// Buffer size.
    pub bytes: u64,
    /// dma-buf: `Ok` or why not.
    #[serde(serialize_with = "ser_outcome")]
    pub dmabuf: Result<(), RdmaError>,
    /// peermem: `Ok` or why not.
    #[serde(serialize_with = "ser_outcome")]
    pub peermem: Result<(), RdmaError>,
    /// The mechanism gdx would use (dma-buf preferred), `None` when neither works.
    pub worked: Option<Mechanism>,
}

/// A registration outcome as it serialised when its error was text: `{"Ok": null}` or
/// `{"Err": "why"}`.
fn ser_outcome<S: serde::Serializer>(r: &Result<(), RdmaError>, s: S) -> Result<S::Ok, S::Error> {
    r.as_ref()
        .map(|_| ())
        .map_err(ToString::to_string)
        .serialize(s)
}

/// The active probe: allocate `bytes` on GPU `gpu` and register it on every RDMA device
/// with dma-buf and with peermem separately, reporting which worked.
pub fn probe_gpu_registration(gpu: u32, bytes: usize) -> Result<Vec<NicRegProbe>, RdmaError> {
    use gdx_sys::cuda::{Context, Cuda, DeviceBuffer};
    let devices = discovery::discover()?;
    let cuda = Cuda::load().map_err(RdmaError::Library)?;
    let ctx = Context::new(&cuda.device(gpu)?)?;
    let buf = Arc::new(DeviceBuffer::new(&ctx, bytes)?);
    let mut out = Vec::new();
    for d in devices {
        let rctx = match RdmaContext::open(&d.name) {
            Ok(c) => c,
            Err(e) => {
                let e = RdmaError::from(e);
                out.push(NicRegProbe {
                    device: d.name.clone(),
                    gpu,
                    bytes: bytes as u64,
                    dmabuf: Err(e.clone()),
                    peermem: Err(e),
                    worked: None,
                });
                continue;
            }
        };
        let try_one = |dmabuf: bool| -> Result<(), RdmaError> {
            let r = VerbsRegistrar::new(
                rctx.clone(),
                RegPolicy {
                    strict: true,
                    dmabuf,
                    peermem: !dmabuf,
                    access: Access::ALL,
                },
            );
            r.register(&Memory::gpu(Arc::clone(&buf))).map(drop)
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
