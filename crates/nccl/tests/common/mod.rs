//! Synthetic machines (sysfs trees read by gdx_topo::from_root), the kind gdx-doctor's tests
//! build, shaped to match the GPUs and HCAs the fixture logs name.
#![allow(dead_code)]

use gdx_topo::fixture::{RdmaPort, SysfsFixture};
use gdx_topo::Topology;
use std::path::Path;

/// GPU0 at 0000:1c:00.0 (busId `1c000` in NVIDIA/nccl#1537) with RoCE `mlx5_0` behind the
/// same PCIe switch (PIX), and RoCE `mlx5_1` on the other socket (SYS).
pub fn rail_machine(root: &Path) -> Topology {
    let mut f = SysfsFixture::new(root);
    f.numa_node(0, "0-15").numa_node(1, "16-31");
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(&rp, "0000:1a:00.0", &["0000:1b:00.0", "0000:1b:01.0"]);
    f.gpu(&sw.downstream[0], "0000:1c:00.0");
    let nic0 = f.nic(&sw.downstream[1], "0000:1d:00.0");
    f.rdma(&nic0, "mlx5_0", &[RdmaPort::roce(1, "eth2", [10, 0, 0, 2])]);
    f.netdev(&nic0, "eth2", Some(200_000));
    let rp1 = f.root_port("0000:80", "0000:80:01.0", Some(1));
    let nic1 = f.nic(&rp1, "0000:81:00.0");
    f.rdma(&nic1, "mlx5_1", &[RdmaPort::roce(1, "eth3", [10, 0, 1, 2])]);
    f.netdev(&nic1, "eth3", Some(200_000));
    gdx_topo::from_root(root).unwrap()
}

/// Two GPUs behind one PCIe switch (PIX), no RDMA NIC, one plain Ethernet NIC.
pub fn two_gpu_switch_machine(root: &Path) -> Topology {
    let mut f = SysfsFixture::new(root);
    f.numa_node(0, "0-15");
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(&rp, "0000:10:00.0", &["0000:11:00.0", "0000:11:01.0"]);
    f.gpu(&sw.downstream[0], "0000:12:00.0");
    f.gpu(&sw.downstream[1], "0000:13:00.0");
    let rp1 = f.root_port("0000:00", "0000:00:02.0", Some(0));
    let eth = f.nic(&rp1, "0000:20:00.0");
    f.netdev(&eth, "ens1", Some(100_000));
    gdx_topo::from_root(root).unwrap()
}

/// A flattened VM like the H200 test machine: GPUs and an InfiniBand HCA directly on the root
/// bus, no switch, no NUMA node.
pub fn flat_vm(root: &Path) -> Topology {
    let mut f = SysfsFixture::new(root);
    let hb = f.host_bridge("0000:00", None);
    f.gpu(&hb, "0000:00:06.0");
    f.gpu(&hb, "0000:00:07.0");
    let nic = f.nic(&hb, "0000:00:08.0");
    f.rdma(&nic, "mlx5_0", &[RdmaPort::infiniband(1)]);
    gdx_topo::from_root(root).unwrap()
}

/// The doctor's findings for a synthetic root (no live libraries, no probes).
pub fn doctor(root: &Path) -> Vec<gdx_doctor::Finding> {
    let mut opts = gdx_doctor::Options::new(root);
    opts.root_is_this_machine = Some(false);
    gdx_doctor::run(&opts).unwrap().findings
}
