//! Test helpers: synthetic sysfs/proc trees (real folders and symlinks in a temp dir, laid out
//! like the kernel's) and topologies that match them.

use crate::context::Context;
use crate::facts::{Gathered, StaticFacts};
use crate::DoctorError;
use gdx_topo::{
    Attachment, Device, DeviceKind, NvLink, NvLinkTarget, PciAddr, Source, Switch, SwitchId,
    Topology,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A temp folder laid out like `/`.
pub struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    /// An empty root.
    pub fn new() -> Tree {
        Tree {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Write a file (creating folders).
    pub fn file(&self, rel: &str, contents: impl AsRef<[u8]>) -> &Self {
        let p = self.root().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, contents).expect("write");
        self
    }

    /// Create a folder.
    pub fn dir(&self, rel: &str) -> &Self {
        std::fs::create_dir_all(self.root().join(rel)).expect("mkdir");
        self
    }

    /// A symlink at `rel` to the in-root path `target`, written relative to the link's real
    /// folder as the kernel writes them (so it resolves the same inside any root).
    pub fn link(&self, rel: &str, target: &str) -> &Self {
        let rel_p = Path::new(rel);
        let parent = rel_p.parent().expect("parent").to_str().expect("utf8");
        let real_parent = gdx_topo::sysfs::RootFs::new(self.root())
            .resolve_partial(parent)
            .expect("resolvable parent");
        let ups = real_parent.components().count();
        let mut t = PathBuf::new();
        for _ in 0..ups {
            t.push("..");
        }
        t.push(target);
        let host_parent = self.root().join(&real_parent);
        std::fs::create_dir_all(&host_parent).expect("mkdir");
        std::os::unix::fs::symlink(t, host_parent.join(rel_p.file_name().expect("name")))
            .expect("symlink");
        self
    }

    /// A PCI function at `sys/devices/<hb>/<chain...>/<bdf>` with the bus symlink, healthy
    /// Gen5 x16 link files and NUMA node 0.
    pub fn pci(&self, hb: &str, chain: &[&str], bdf: &str, vendor: u16, device: u16, class: u32) {
        let mut rel = PathBuf::from("sys/devices").join(hb);
        for c in chain {
            rel.push(c);
        }
        rel.push(bdf);
        let rel_s = rel.to_string_lossy().to_string();
        let f = |name: &str, v: String| {
            self.file(&format!("{rel_s}/{name}"), v + "\n");
        };
        f("vendor", format!("0x{vendor:04x}"));
        f("device", format!("0x{device:04x}"));
        f("class", format!("0x{class:06x}"));
        f("numa_node", "0".into());
        f("current_link_speed", "32.0 GT/s PCIe".into());
        f("max_link_speed", "32.0 GT/s PCIe".into());
        f("current_link_width", "16".into());
        f("max_link_width", "16".into());
        self.link(&format!("sys/bus/pci/devices/{bdf}"), &rel_s);
    }

    /// An NVIDIA H200-like GPU.
    pub fn gpu(&self, hb: &str, chain: &[&str], bdf: &str) {
        self.pci(hb, chain, bdf, 0x10de, 0x2335, 0x030200);
    }

    /// A ConnectX-7-like NIC function.
    pub fn nic(&self, hb: &str, chain: &[&str], bdf: &str) {
        self.pci(hb, chain, bdf, 0x15b3, 0x1021, 0x020000);
    }

    /// A PCIe bridge port.
    pub fn bridge(&self, hb: &str, chain: &[&str], bdf: &str) {
        self.pci(hb, chain, bdf, 0x1000, 0xc030, 0x060400);
    }

    /// Write an attribute file of a PCI function (through the bus symlink).
    pub fn attr(&self, bdf: &str, name: &str, contents: impl AsRef<[u8]>) -> &Self {
        self.file(&format!("sys/bus/pci/devices/{bdf}/{name}"), contents)
    }

    /// An RDMA device on PCI function `bdf` with ports `(state, link_layer)`, numbered from 1,
    /// and optional netdev.
    pub fn rdma(&self, name: &str, bdf: &str, ports: &[(&str, &str)], netdev: Option<&str>) {
        let dir = format!("sys/class/infiniband/{name}");
        self.dir(&dir);
        let real = gdx_topo::sysfs::RootFs::new(self.root())
            .resolve_partial(format!("sys/bus/pci/devices/{bdf}"))
            .expect("device");
        self.link(&format!("{dir}/device"), real.to_str().expect("utf8"));
        for (i, (state, ll)) in ports.iter().enumerate() {
            let pd = format!("{dir}/ports/{}", i + 1);
            self.file(&format!("{pd}/state"), format!("{state}\n"));
            let phys = if state.contains("ACTIVE") {
                "5: LinkUp"
            } else {
                "3: Disabled"
            };
            self.file(&format!("{pd}/phys_state"), format!("{phys}\n"));
            self.file(&format!("{pd}/link_layer"), format!("{ll}\n"));
            self.file(&format!("{pd}/rate"), "400 Gb/sec (4X NDR)\n");
        }
        if let Some(n) = netdev {
            self.attr(bdf, &format!("net/{n}/mtu"), "9000\n");
            self.file(&format!("sys/class/net/{n}/mtu"), "9000\n");
        }
    }

    /// The NIC most check tests need: a ConnectX-7-like function at 0000:00:03.0 under
    /// pci0000:00 with RDMA device `mlx5_0`, one active InfiniBand port and no netdev.
    pub fn ib_nic(&self) -> &Self {
        self.nic("pci0000:00", &[], "0000:00:03.0");
        self.ib_rdma("0000:00:03.0")
    }

    /// RDMA device `mlx5_0` on the NIC function at `bdf`: one active InfiniBand port, no
    /// netdev.
    pub fn ib_rdma(&self, bdf: &str) -> &Self {
        self.rdma("mlx5_0", bdf, &[("4: ACTIVE", "InfiniBand")], None);
        self
    }

    /// A tree with an H200-like GPU at 0000:00:06.0 and [`Tree::ib_nic`]: the machine of the
    /// GPUDirect RDMA checks.
    pub fn with_gpu_and_ib_nic() -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.ib_nic();
        t
    }

    /// The same NIC as [`Tree::ib_nic`] as RoCE: one active Ethernet port on netdev `eth2`.
    pub fn roce_nic(&self) -> &Self {
        self.nic("pci0000:00", &[], "0000:00:03.0");
        self.rdma(
            "mlx5_0",
            "0000:00:03.0",
            &[("4: ACTIVE", "Ethernet")],
            Some("eth2"),
        );
        self
    }

    /// A context builder over this tree.
    pub fn ctx(&self) -> CtxBuilder<'_> {
        CtxBuilder {
            tree: self,
            env: BTreeMap::new(),
            topo: Err(DoctorError::NoTopology),
            live: Err(DoctorError::NoLiveFacts),
        }
    }
}

/// Builds a [`Context`] over a [`Tree`].
pub struct CtxBuilder<'a> {
    tree: &'a Tree,
    env: BTreeMap<String, String>,
    topo: Result<Topology, DoctorError>,
    live: Result<Gathered, DoctorError>,
}

impl CtxBuilder<'_> {
    /// Set an environment variable.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.insert(k.into(), v.into());
        self
    }

    /// Use this topology.
    pub fn topo(mut self, t: Topology) -> Self {
        self.topo = Ok(t);
        self
    }

    /// Use these live facts.
    pub fn live(mut self, f: StaticFacts) -> Self {
        self.live = Ok(Gathered::from(&f));
        self
    }

    /// The context.
    pub fn build(self) -> Context {
        Context::new(self.tree.root(), self.env, self.topo, self.live)
    }
}

/// Shorthand for a PCI address literal.
pub fn bdf(s: &str) -> PciAddr {
    s.parse().expect("test BDF")
}

/// A topology with devices placed by (label, kind, bdf, host bridge, switch indices, numa).
pub struct TopoBuilder {
    topo: Topology,
}

impl TopoBuilder {
    /// Empty, with `n` switches (upstream addresses are dummies).
    pub fn new(switches: usize) -> Self {
        TopoBuilder {
            topo: Topology {
                source: Source::Sysfs("/test".into()),
                devices: Vec::new(),
                switches: (0..switches)
                    .map(|i| Switch {
                        upstream: PciAddr {
                            domain: 0xffff,
                            bus: i as u8,
                            device: 0,
                            function: 0,
                        },
                        downstream: Vec::new(),
                        vendor: None,
                        device_id: None,
                        link: Default::default(),
                        parent: None,
                        is_virtual: false,
                    })
                    .collect(),
                host_bridges: Vec::new(),
                numa_nodes: Vec::new(),
                nvml_enriched: false,
                notes: Vec::new(),
            },
        }
    }

    /// Add a device.
    pub fn dev(mut self, label: &str, kind: DeviceKind, at: &str, hb: &str, sw: &[usize]) -> Self {
        let mut d = Device::new(kind, Some(bdf(at)));
        d.label = label.into();
        d.vendor = Some(if kind == DeviceKind::Gpu {
            0x10de
        } else {
            0x15b3
        });
        d.attach = Attachment {
            host_bridge: Some(hb.into()),
            switches: sw.iter().map(|&i| SwitchId(i)).collect(),
        };
        self.topo.devices.push(d);
        self
    }

    /// Join two GPUs with `n` NVLinks (and mark the topology NVML-enriched).
    pub fn nvlink(mut self, a: &str, b: &str, n: u32) -> Self {
        let bb = bdf(b);
        if let Some(d) = self.topo.devices.iter_mut().find(|d| d.bdf == Some(bdf(a))) {
            if let Some(g) = d.gpu.as_mut() {
                g.nvlinks.push(NvLink {
                    target: NvLinkTarget::Gpu(bb),
                    count: n,
                });
                g.compute_capability = Some("9.0".into());
            }
        }
        self.topo.nvml_enriched = true;
        self
    }

    /// The topology.
    pub fn build(self) -> Topology {
        self.topo
    }
}

/// Live facts with working CUDA (devices at the given GPUs, all attributes on) and every
/// other library "not queried".
pub fn cuda_facts(gpus: &[&str]) -> StaticFacts {
    let gpus: Vec<PciAddr> = gpus.iter().map(|g| bdf(g)).collect();
    let mut f = StaticFacts::none();
    f.cuda = Ok(crate::facts::CudaFacts::healthy(
        "/usr/lib/libcuda.so.1",
        &gpus,
    ));
    f
}

/// Findings of one check over a context.
pub fn run(check: &dyn crate::checks::Check, ctx: &Context) -> Vec<crate::Finding> {
    check.run(ctx)
}

/// The single finding with this subject.
pub fn subject<'a>(fs: &'a [crate::Finding], s: &str) -> &'a crate::Finding {
    let m: Vec<_> = fs.iter().filter(|f| f.subject == s).collect();
    assert_eq!(m.len(), 1, "want one finding for {s}, got {fs:#?}");
    m[0]
}

/// The trees built here read as intended through topo's sysfs layer (the checks' PCI facts).
#[cfg(test)]
mod tests {
    use super::Tree;
    use gdx_topo::sysfs::devices::{bridges_between, chain, scan};
    use gdx_topo::sysfs::RootFs;

    #[test]
    fn chain_and_bridges_between() {
        let t = Tree::new();
        t.bridge("pci0000:00", &[], "0000:00:01.0");
        t.bridge("pci0000:00", &["0000:00:01.0"], "0000:01:00.0");
        t.bridge(
            "pci0000:00",
            &["0000:00:01.0", "0000:01:00.0"],
            "0000:02:01.0",
        );
        t.bridge(
            "pci0000:00",
            &["0000:00:01.0", "0000:01:00.0"],
            "0000:02:02.0",
        );
        let up = ["0000:00:01.0", "0000:01:00.0"];
        t.gpu(
            "pci0000:00",
            &[&up[..], &["0000:02:01.0"]].concat(),
            "0000:03:00.0",
        );
        t.nic(
            "pci0000:00",
            &[&up[..], &["0000:02:02.0"]].concat(),
            "0000:04:00.0",
        );
        let fs = RootFs::new(t.root());
        let g = chain(&fs, "0000:03:00.0".parse().unwrap()).unwrap();
        assert_eq!(g.host_bridge, "pci0000:00");
        assert_eq!(g.bridges.len(), 3);
        let n = chain(&fs, "0000:04:00.0".parse().unwrap()).unwrap();
        let between: Vec<String> = bridges_between(&g, &n)
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(between, ["0000:02:01.0", "0000:02:02.0"]);
        assert!(chain(&fs, "0000:09:00.0".parse().unwrap()).is_err());
        let fns = scan(&fs).unwrap();
        assert_eq!(fns.iter().filter(|f| f.is_nvidia_gpu()).count(), 1);
        assert_eq!(fns.iter().filter(|f| f.is_bridge()).count(), 4);
    }
}
