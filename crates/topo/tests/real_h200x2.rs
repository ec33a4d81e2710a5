//! A real machine: `gdx topo --capture` taken on the 2× H200 test machine (Firecracker VM,
//! flat PCI bus, numa_node -1, 18 NVLinks per GPU to NVSwitches). `nvidia-smi topo -m` there
//! shows GPU0–GPU1 as NV18 (docs/topo-h200x2.md); the capture must say the same
//! anywhere, without NVML.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::fixture::h200x2_capture as capture;
use gdx_topo::{from_root, DeviceKind, PathClass, Source};

#[test]
fn h200x2_capture_gives_nv18_like_nvidia_smi() {
    let topo = from_root(&capture()).expect("capture loads");
    assert!(matches!(topo.source, Source::Sysfs(_)));
    assert!(topo.nvml_enriched, "the capture carries NVML facts");
    let gpus: Vec<_> = topo.gpus().collect();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].bdf.unwrap().to_string(), "0000:00:06.0");
    assert_eq!(gpus[1].bdf.unwrap().to_string(), "0000:00:07.0");
    assert_eq!(gpus[0].name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(topo.class_between("GPU0", "GPU1"), Some(PathClass::Nv(18)));
    assert_eq!(topo.class_between("GPU1", "GPU0"), Some(PathClass::Nv(18)));
    // Flat VM bus: the GPUs and the virtio NIC meet only at the root complex.
    let nic = topo.nics().next().expect("virtio NIC");
    assert_eq!(nic.kind, DeviceKind::Nic);
    assert_eq!(topo.class_between("GPU0", &nic.label), Some(PathClass::Phb));
    assert_eq!(gpus[0].numa, None, "numa_node is -1 there");
    let g = gpus[0].gpu.as_ref().unwrap();
    assert_eq!(g.bar1_mib, Some(262144));
    assert_eq!(g.nvlinks.iter().map(|l| l.count).sum::<u32>(), 18);
    // PCIe Gen5 x16 on both ends.
    assert_eq!(gpus[0].link.current.generation(), Some(5));
    assert_eq!(gpus[0].link.max.width, Some(16));
}
