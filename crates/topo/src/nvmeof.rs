//! NVMe over Fabrics: the controllers this machine reaches over a fabric (`transport` `rdma`,
//! `tcp`, `fc` or `loop` under `sys/class/nvme/*`), their namespaces, their target, their
//! timeouts and multipath, and the local NIC that carries them, so that `gdx topo` can list
//! them and the doctor can judge them.
//!
//! What carries a controller is not in sysfs (a fabric controller sits under
//! `devices/virtual/nvme-fabrics`). Two sources say it, and both are kept as evidence:
//! - the RDMA connection manager's view, `rdma res show cm_id`: the controller's queues are
//!   `cm_id`s of `[nvme_rdma]` whose destination is the target, each naming its RDMA device and
//!   port. Live this runs `rdma -j res show cm_id` (iproute2, as root); a capture keeps its
//!   output as `gdx/rdma-cm-id.json` ([`CM_ID_PATH`]);
//! - the route to the target address (`proc/net/route`, longest prefix), which names the
//!   netdev; an RDMA device whose GID table or PCI function holds that netdev is the one.

use crate::model::Topology;
use crate::path::PathClass;
use crate::sysfs::devices::rdma_devices;
use crate::sysfs::RootFs;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// Where a capture keeps the output of `rdma -j res show cm_id`.
pub const CM_ID_PATH: &str = "gdx/rdma-cm-id.json";

const NVME_CLASS: &str = "sys/class/nvme";
const SUBSYS_CLASS: &str = "sys/class/nvme-subsystem";

/// A controller timeout in seconds, or off (the kernel writes `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Timeout {
    /// Never: I/O waits as long as the controller reconnects (`off`).
    Off,
    /// This many seconds.
    Secs(u32),
}

impl Timeout {
    fn parse(s: &str) -> Option<Timeout> {
        let s = s.trim();
        if s == "off" {
            return Some(Timeout::Off);
        }
        s.parse().ok().map(Timeout::Secs)
    }
}

impl std::fmt::Display for Timeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Timeout::Off => f.write_str("off"),
            Timeout::Secs(s) => write!(f, "{s} s"),
        }
    }
}

/// The local side carrying a fabric controller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carrier {
    /// The netdev the route to the target leaves through.
    pub netdev: Option<String>,
    /// The RDMA device (`rdma` transport).
    pub rdma_device: Option<String>,
    /// Its port.
    pub port: Option<u32>,
    /// What was read to say so.
    pub evidence: Vec<String>,
}

/// One NVMe-oF controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Controller {
    /// `nvme0`.
    pub name: String,
    /// `rdma`, `tcp`, `fc`, `loop`.
    pub transport: String,
    /// `address` as the kernel writes it (`traddr=198.51.100.2,trsvcid=4420`).
    pub address: String,
    /// The target address.
    pub traddr: Option<String>,
    /// The target port (service id).
    pub trsvcid: Option<String>,
    /// `state`: `live`, `connecting`, `resetting`, `deleting`, ...
    pub state: Option<String>,
    /// The subsystem NQN.
    pub subsysnqn: Option<String>,
    /// How long the kernel keeps reconnecting before it fails I/O and drops the controller.
    pub ctrl_loss_tmo: Option<Timeout>,
    /// How long after a connection loss queued I/O fails while reconnects go on.
    pub fast_io_fail_tmo: Option<Timeout>,
    /// Seconds between reconnect attempts.
    pub reconnect_delay: Option<u32>,
    /// Keep-alive timeout in seconds.
    pub kato: Option<u32>,
    /// Block devices of its namespaces (`nvme0n1`).
    pub namespaces: Vec<String>,
    /// The NVMe subsystem it belongs to (`nvme-subsys0`).
    pub subsystem: Option<String>,
    /// Every controller of that subsystem (the paths to the namespaces; more than one is
    /// multipath).
    pub paths: Vec<String>,
    /// The subsystem's `iopolicy` (native multipath), if any.
    pub iopolicy: Option<String>,
    /// The local side carrying it.
    pub carrier: Carrier,
}

impl Controller {
    /// `rdma 198.51.100.2:4420`.
    pub fn target(&self) -> String {
        format!(
            "{} {}:{}",
            self.transport,
            self.traddr.as_deref().unwrap_or("?"),
            self.trsvcid.as_deref().unwrap_or("?")
        )
    }

    /// The fabric path in words: `nvme0 over rdma via rxe0/1 (eth0) to 198.51.100.2:4420`.
    pub fn fabric_path(&self) -> String {
        let via = match (
            &self.carrier.rdma_device,
            self.carrier.port,
            &self.carrier.netdev,
        ) {
            (Some(d), Some(p), Some(n)) => format!(" via {d}/{p} ({n})"),
            (Some(d), None, Some(n)) => format!(" via {d} ({n})"),
            (Some(d), _, None) => format!(" via {d}"),
            (None, _, Some(n)) => format!(" via {n}"),
            (None, _, None) => " via an unknown local NIC".to_string(),
        };
        format!(
            "{} over {}{via} to {}:{}",
            self.name,
            self.transport,
            self.traddr.as_deref().unwrap_or("?"),
            self.trsvcid.as_deref().unwrap_or("?")
        )
    }

    /// The path class from each GPU of `topo` to the carrying RDMA device: `None` for a GPU
    /// when the device is software RDMA or not in the topology (no PCI function to measure).
    pub fn gpu_classes(&self, topo: &Topology) -> Vec<(String, Option<PathClass>)> {
        let nic = self.carrier.rdma_device.as_deref().and_then(|name| {
            topo.nics().find(|d| {
                d.nic
                    .as_ref()
                    .is_some_and(|n| n.rdma_name.as_deref() == Some(name) && !n.software)
                    && d.bdf.is_some()
            })
        });
        topo.gpus()
            .map(|g| (g.label.clone(), nic.map(|n| topo.pcie_class(g, n))))
            .collect()
    }
}

/// Every fabric controller under the root, by name. PCIe controllers are left out.
pub fn controllers(fs: &RootFs) -> Vec<Controller> {
    let cm_ids = cm_ids(fs);
    let routes = routes(fs);
    let mut out: Vec<Controller> = fs
        .names_or_empty(NVME_CLASS)
        .into_iter()
        .filter_map(|name| controller(fs, &name, &cm_ids, &routes))
        .collect();
    out.sort_by(|a, b| crate::natural_cmp(&a.name, &b.name));
    out
}

fn controller(fs: &RootFs, name: &str, cm: &CmIds, routes: &[Route]) -> Option<Controller> {
    let dir = format!("{NVME_CLASS}/{name}");
    let transport = fs.text(&format!("{dir}/transport"))?.trim().to_string();
    if !matches!(transport.as_str(), "rdma" | "tcp" | "fc" | "loop") {
        return None;
    }
    let attr = |f: &str| fs.text(&format!("{dir}/{f}")).map(|s| s.trim().to_string());
    let address = attr("address").unwrap_or_default();
    let field = |k: &str| {
        address
            .split(',')
            .find_map(|kv| kv.trim().strip_prefix(&format!("{k}=")).map(str::to_string))
    };
    let (traddr, trsvcid) = (field("traddr"), field("trsvcid"));
    let (subsystem, paths, iopolicy, mut namespaces) = subsystem_of(fs, name);
    for e in fs.names_or_empty(&dir) {
        if is_namespace(&e) && !namespaces.contains(&e) {
            namespaces.push(e);
        }
    }
    namespaces.sort_by(|a, b| crate::natural_cmp(a, b));
    let mut c = Controller {
        name: name.to_string(),
        transport,
        address: address.clone(),
        traddr,
        trsvcid,
        state: attr("state"),
        subsysnqn: attr("subsysnqn"),
        ctrl_loss_tmo: attr("ctrl_loss_tmo").as_deref().and_then(Timeout::parse),
        fast_io_fail_tmo: attr("fast_io_fail_tmo").as_deref().and_then(Timeout::parse),
        reconnect_delay: attr("reconnect_delay").and_then(|s| s.parse().ok()),
        kato: attr("kato").and_then(|s| s.parse().ok()),
        namespaces,
        subsystem,
        paths,
        iopolicy,
        carrier: Carrier::default(),
    };
    c.carrier = carrier(fs, &c, cm, routes);
    Some(c)
}

/// `nvme0n1` (a namespace's block device), not `nvme0c0n1` (a multipath path's hidden one).
fn is_namespace(e: &str) -> bool {
    let Some(rest) = e.strip_prefix("nvme") else {
        return false;
    };
    let mut parts = rest.splitn(2, 'n');
    let (Some(a), Some(b)) = (parts.next(), parts.next()) else {
        return false;
    };
    !a.is_empty()
        && a.bytes().all(|c| c.is_ascii_digit())
        && !b.is_empty()
        && b.bytes().all(|c| c.is_ascii_digit())
}

fn is_controller_name(e: &str) -> bool {
    e.strip_prefix("nvme")
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_digit()))
}

type SubsysFacts = (Option<String>, Vec<String>, Option<String>, Vec<String>);

/// The subsystem holding controller `name`: its name, its controllers, its iopolicy and its
/// namespaces (with native multipath the block devices live there, not under the controller).
fn subsystem_of(fs: &RootFs, name: &str) -> SubsysFacts {
    for s in fs.names_or_empty(SUBSYS_CLASS) {
        let dir = format!("{SUBSYS_CLASS}/{s}");
        let entries = fs.names_or_empty(&dir);
        if !entries.iter().any(|e| e == name) {
            continue;
        }
        let mut paths: Vec<String> = entries
            .iter()
            .filter(|e| is_controller_name(e))
            .cloned()
            .collect();
        paths.sort_by(|a, b| crate::natural_cmp(a, b));
        let ns = entries.into_iter().filter(|e| is_namespace(e)).collect();
        let iopolicy = fs
            .text(&format!("{dir}/iopolicy"))
            .map(|t| t.trim().to_string());
        return (Some(s), paths, iopolicy, ns);
    }
    (None, vec![name.to_string()], None, Vec::new())
}

/// One `[nvme_rdma]` (or any) RDMA CM id: device, port, destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmId {
    /// RDMA device.
    pub device: String,
    /// Port.
    pub port: Option<u32>,
    /// The owner (`[nvme_rdma]` for the kernel's NVMe initiator).
    pub comm: String,
    /// Destination address.
    pub dst_addr: String,
    /// Destination port.
    pub dst_port: Option<u32>,
}

/// Why the CM ids could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmIdError {
    /// `rdma -j` gave JSON that is not an array.
    #[error("cm_id JSON is not an array")]
    NotAnArray,
    /// The text is neither of `rdma`'s forms.
    #[error("neither rdma's JSON nor its text form")]
    Unrecognised,
    /// A capture without the CM id file.
    #[error("{} is not in the capture", path.display())]
    NotInCapture {
        /// The file, as shown (inside the capture).
        path: std::path::PathBuf,
    },
    /// The `rdma` tool ran and failed.
    #[error("{command} failed: {stderr}")]
    ToolFailed {
        /// The command line.
        command: &'static str,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The `rdma` tool could not be started.
    #[error("{command}: {source} (iproute2's rdma tool)")]
    NoTool {
        /// The command line.
        command: &'static str,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
}

type CmIds = (Result<Vec<CmId>, CmIdError>, String);

/// The CM ids and where they were read: a capture's [`CM_ID_PATH`], else `rdma -j res show
/// cm_id` on this machine.
fn cm_ids(fs: &RootFs) -> CmIds {
    if let Some(t) = fs.text(CM_ID_PATH) {
        return (parse_cm_ids(&t), fs.show(CM_ID_PATH));
    }
    if !crate::sysfs::rootfs::is_host_root(fs.root()) {
        let path = fs.show(CM_ID_PATH);
        return (
            Err(CmIdError::NotInCapture {
                path: path.clone().into(),
            }),
            path,
        );
    }
    const COMMAND: &str = "rdma -j res show cm_id";
    let r = match std::process::Command::new("rdma")
        .args(["-j", "res", "show", "cm_id"])
        .output()
    {
        Ok(o) if o.status.success() => parse_cm_ids(&String::from_utf8_lossy(&o.stdout)),
        Ok(o) => Err(CmIdError::ToolFailed {
            command: COMMAND,
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        }),
        Err(source) => Err(CmIdError::NoTool {
            command: COMMAND,
            source,
        }),
    };
    (r, COMMAND.to_string())
}

/// Live `rdma -j res show cm_id` output as a capture stores it (`None` when the tool fails).
pub fn capture_cm_ids() -> Option<String> {
    let o = std::process::Command::new("rdma")
        .args(["-j", "res", "show", "cm_id"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Parse `rdma -j res show cm_id` (a JSON array of objects with `ifname`, `port`, `comm`
/// (`nvme_rdma`; the text form brackets kernel owners), `dst-addr` as `address:port`), or its
/// text form (`link rxe0/1 ... comm [nvme_rdma] ...
/// dst-addr 198.51.100.2:4420`).
pub fn parse_cm_ids(text: &str) -> Result<Vec<CmId>, CmIdError> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        let arr = v.as_array().ok_or(CmIdError::NotAnArray)?;
        return Ok(arr
            .iter()
            .filter_map(|o| {
                let s = |k: &str| o.get(k).and_then(|x| x.as_str()).map(str::to_string);
                let n = |k: &str| o.get(k).and_then(|x| x.as_u64()).map(|x| x as u32);
                // iproute2 writes `"dst-addr": "198.51.100.2:4420"` (address and port in one
                // string); a separate `dst-port` is taken when present.
                let (dst_addr, port_in_addr) = split_addr(&s("dst-addr").unwrap_or_default());
                Some(CmId {
                    device: s("ifname")?,
                    port: n("port"),
                    comm: s("comm").unwrap_or_default(),
                    dst_addr,
                    dst_port: n("dst-port").or(port_in_addr),
                })
            })
            .collect());
    }
    let mut out = Vec::new();
    for line in text.lines() {
        let toks: Vec<&str> = line.split_whitespace().collect();
        let after = |k: &str| {
            toks.iter()
                .position(|t| *t == k)
                .and_then(|i| toks.get(i + 1))
        };
        let Some(link) = after("link") else { continue };
        let (device, port) = match link.split_once('/') {
            Some((d, p)) => (d.to_string(), p.parse().ok()),
            None => (link.to_string(), None),
        };
        let (dst_addr, dst_port) = split_addr(after("dst-addr").copied().unwrap_or_default());
        out.push(CmId {
            device,
            port,
            comm: after("comm").map(|s| s.to_string()).unwrap_or_default(),
            dst_addr,
            dst_port,
        });
    }
    if out.is_empty() && !text.trim().is_empty() {
        return Err(CmIdError::Unrecognised);
    }
    Ok(out)
}

/// `198.51.100.2:4420` → (`198.51.100.2`, 4420); an address without a port is kept whole.
fn split_addr(a: &str) -> (String, Option<u32>) {
    match a.rsplit_once(':') {
        Some((host, p)) if p.parse::<u32>().is_ok() && !host.is_empty() => {
            (host.to_string(), p.parse().ok())
        }
        _ => (a.to_string(), None),
    }
}

/// One IPv4 route of `proc/net/route`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    iface: String,
    dest: u32,
    mask: u32,
}

fn routes(fs: &RootFs) -> Vec<Route> {
    let Some(t) = fs.text("proc/net/route") else {
        return Vec::new();
    };
    t.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...: the kernel prints the
            // network-order address as a little-endian (x86) integer, so 198.51.100.0 is
            // 006433C6; turn it back into the address as a big-endian integer.
            let hex = |s: &str| {
                u32::from_str_radix(s, 16)
                    .ok()
                    .map(|v| u32::from_be_bytes(v.to_le_bytes()))
            };
            Some(Route {
                iface: f.first()?.to_string(),
                dest: hex(f.get(1)?)?,
                mask: hex(f.get(7)?)?,
            })
        })
        .collect()
}

/// The netdev of the longest-prefix route to `addr`.
fn route_to(routes: &[Route], addr: Ipv4Addr) -> Option<&Route> {
    let a = u32::from_be_bytes(addr.octets());
    routes
        .iter()
        .filter(|r| a & r.mask == r.dest & r.mask)
        .max_by_key(|r| r.mask.count_ones())
}

fn carrier(fs: &RootFs, c: &Controller, cm: &CmIds, routes: &[Route]) -> Carrier {
    let mut k = Carrier::default();
    let (Some(addr), port) = (&c.traddr, c.trsvcid.as_deref().and_then(|p| p.parse().ok())) else {
        k.evidence
            .push(format!("{}: no traddr in its address", c.name));
        return k;
    };
    if c.transport == "rdma" {
        match &cm.0 {
            Ok(ids) => {
                let q: Vec<&CmId> = ids
                    .iter()
                    .filter(|i| &i.dst_addr == addr && (port.is_none() || i.dst_port == port))
                    .filter(|i| i.comm.contains("nvme"))
                    .collect();
                if let Some(first) = q.first() {
                    k.rdma_device = Some(first.device.clone());
                    k.port = first.port;
                    k.evidence.push(format!(
                        "{}: {} queue(s) of {} on {}/{} to {addr}:{}",
                        cm.1,
                        q.len(),
                        first.comm,
                        first.device,
                        first.port.map(|p| p.to_string()).unwrap_or("?".into()),
                        c.trsvcid.as_deref().unwrap_or("?")
                    ));
                } else {
                    k.evidence
                        .push(format!("{}: no nvme cm_id to {addr}", cm.1));
                }
            }
            Err(e) => k.evidence.push(e.to_string()),
        }
    }
    if let Ok(ip) = addr.parse::<Ipv4Addr>() {
        match route_to(routes, ip) {
            Some(r) => {
                k.netdev = Some(r.iface.clone());
                k.evidence.push(format!(
                    "{}: {addr} leaves through {} (/{} route)",
                    fs.show("proc/net/route"),
                    r.iface,
                    r.mask.count_ones()
                ));
            }
            None => k
                .evidence
                .push(format!("{}: no route to {addr}", fs.show("proc/net/route"))),
        }
    }
    if k.rdma_device.is_none() && c.transport == "rdma" {
        if let Some(n) = &k.netdev {
            if let Some((dev, port)) = rdma_on_netdev(fs, n) {
                k.evidence.push(format!("{dev}/{port} sits on {n}"));
                k.rdma_device = Some(dev);
                k.port = Some(port);
            }
        }
    }
    k
}

/// The RDMA device and port whose GID table or PCI function holds `netdev`.
pub fn rdma_on_netdev(fs: &RootFs, netdev: &str) -> Option<(String, u32)> {
    for d in rdma_devices(fs) {
        for p in &d.ports {
            let ndevs = format!("{}/gid_attrs/ndevs", d.port_dir(p.port));
            let on_gid = fs.names_or_empty(&ndevs).iter().any(|i| {
                fs.text(&format!("{ndevs}/{i}")).as_deref().map(str::trim) == Some(netdev)
            });
            if on_gid || d.netdevs.iter().any(|n| n == netdev) {
                return Some((d.name.clone(), p.port));
            }
        }
    }
    None
}

/// The block device (`nvme0n1`, a partition's disk) holding `path`, from its `st_dev` and
/// `sys/dev/block/MAJ:MIN`; `None` when it is not on a block device.
pub fn disk_of(fs: &RootFs, dev_major: u32, dev_minor: u32) -> Option<String> {
    let rel = format!("sys/dev/block/{dev_major}:{dev_minor}");
    let real = fs.canonical_rel(&rel)?;
    let name = real.file_name()?.to_str()?.to_string();
    // A partition's folder sits inside its disk's folder.
    if fs.exists(&format!("{rel}/partition")) {
        return real
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .map(str::to_string);
    }
    Some(name)
}

/// Linux's `dev_t` split into major and minor (glibc's `gnu_dev_major`/`gnu_dev_minor`).
pub fn dev_major_minor(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// The block device holding file `path` (or, for a file not yet made, its folder) and the
/// fabric controller serving it, if it is on one. Only metadata is read (`stat`, sysfs),
/// never the file's data.
pub fn fabric_of_path(fs: &RootFs, path: &std::path::Path) -> Option<(String, Controller)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok().or_else(|| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        std::fs::metadata(parent.unwrap_or(std::path::Path::new("."))).ok()
    })?;
    // A block device named directly is its own disk (st_rdev); a file is on st_dev's.
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = dev_major_minor(dev);
    let disk = disk_of(fs, major, minor)?;
    let ctrls = controllers(fs);
    let c = controller_of_disk(&ctrls, &disk)?.clone();
    Some((disk, c))
}

/// The fabric controller serving block device `disk`, among `ctrls`.
pub fn controller_of_disk<'a>(ctrls: &'a [Controller], disk: &str) -> Option<&'a Controller> {
    ctrls
        .iter()
        .find(|c| c.namespaces.iter().any(|n| n == disk))
}

mod render;
pub use render::{json, render_text};

#[cfg(test)]
mod tests;
