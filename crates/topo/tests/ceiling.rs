//! The one GPU-pair ceiling on real NCCL topology files: NVLink count × per-link rate, else
//! the slower PCIe link, each with its label.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::ceiling::{gpu_pair, pcie};
use gdx_topo::{from_nccl_xml, Link, Topology};

fn ncv4() -> Topology {
    let dir = gdx_topo::fixture::reference_topologies();
    from_nccl_xml(&dir.join("nccl_topo_azure_ncv4-topo_v2023-06_peer-targets.xml")).unwrap()
}

fn link(gts: f64, width: u32) -> Link {
    Link {
        speed_gts: Some(gts),
        width: Some(width),
    }
}

#[test]
fn nvlink_pairs_are_links_times_the_rate_of_their_generation() {
    let t = ncv4();
    let (a, b) = (t.device("GPU0").unwrap(), t.device("GPU1").unwrap());
    let c = gpu_pair(&t, a, b, None).unwrap();
    // Compute capability 8.0: NVLink 3, 25 GB/s per link, 12 links.
    assert_eq!(c.gbps, 300.0);
    assert_eq!(c.basis, "NV12 x 25.00 GB/s");
    assert_eq!(c.caveat, None);
    let measured = gpu_pair(&t, a, b, Some(20.0)).unwrap();
    assert_eq!(measured.gbps, 240.0);
    assert_eq!(measured.basis, "NV12 x 20.00 GB/s");
}

#[test]
fn an_unknown_capability_says_its_rate_is_assumed() {
    let mut t = ncv4();
    for d in &mut t.devices {
        if let Some(g) = d.gpu.as_mut() {
            g.compute_capability = None;
        }
    }
    let (a, b) = (t.device("GPU0").unwrap(), t.device("GPU1").unwrap());
    let c = gpu_pair(&t, a, b, None).unwrap();
    assert_eq!(c.basis, "NV12 x 26.56 GB/s, per-link rate assumed");
}

#[test]
fn pairs_without_nvlink_take_the_slower_pcie_link_and_its_caveat() {
    let mut t = ncv4();
    // NCCL's file gives no link speeds: none known, no ceiling.
    let (a, b) = (t.device("GPU0").unwrap(), t.device("GPU2").unwrap());
    assert_eq!(gpu_pair(&t, a, b, None), None);
    for d in &mut t.devices {
        match d.label.as_str() {
            "GPU0" => d.link.max = link(16.0, 16),
            "GPU2" => {
                d.link.max = link(8.0, 16);
                d.link.current = link(8.0, 8);
            }
            _ => {}
        }
    }
    let (a, b) = (t.device("GPU0").unwrap(), t.device("GPU2").unwrap());
    let c = gpu_pair(&t, a, b, None).unwrap();
    assert_eq!(c.gbps, link(8.0, 16).raw_gbps().unwrap());
    assert_eq!(c.basis, "PCIe Gen3 x16 (GPU2), SYS");
    let caveat = c.caveat.unwrap();
    assert!(
        caveat.starts_with("GPU2's link runs at 8.0 GT/s x8 now"),
        "{caveat}"
    );
    let one = pcie(a).unwrap();
    assert_eq!(one.basis, "PCIe Gen4 x16 (GPU0)");
    assert_eq!(
        one.caveat, None,
        "no current speed known: nothing to compare"
    );
}

#[test]
fn links_name_their_generation_and_rate() {
    assert_eq!(link(32.0, 16).to_string(), "PCIe Gen5 x16 (63.02 GB/s)");
    assert_eq!(link(2.7, 4).name(), "PCIe 2.7 GT/s x4");
    assert_eq!(Link::default().to_string(), "PCIe 0 GT/s x0");
}
