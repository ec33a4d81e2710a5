//! `gdx topo --nic-map` through the real binary: the JSON parses and gives each GPU its
//! local NIC; the shell text runs in `sh` and exports the chosen GPU's settings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, success_json, success_text};
use gdx_topo::fixture::{RdmaPort, SysfsFixture};

/// Two GPUs, each below its own switch with one InfiniBand NIC (mlx5_0, mlx5_1).
fn two_rails(dir: &std::path::Path) {
    let mut f = SysfsFixture::new(dir);
    f.numa_node(0, "0-31");
    for (i, bus) in [(0u8, 0x10u8), (1, 0x20)] {
        let rp = f.root_port("0000:00", &format!("0000:00:0{}.0", i + 1), Some(0));
        let sw = f.switch_below(
            &rp,
            &format!("0000:{:02x}:00.0", bus),
            &[
                &format!("0000:{:02x}:00.0", bus + 1),
                &format!("0000:{:02x}:01.0", bus + 1),
            ],
        );
        f.gpu(&sw.downstream[0], &format!("0000:{:02x}:00.0", bus + 2));
        let nic = f.nic(&sw.downstream[1], &format!("0000:{:02x}:00.0", bus + 3));
        f.rdma(&nic, &format!("mlx5_{i}"), &[RdmaPort::infiniband(1)]);
    }
}

/// Stdout of `sh -c "TEXT; then"` for GPU `gpu`, with no NCCL/UCX/Mooncake settings inherited;
/// fails the test when sh does.
fn sh(text: &str, then: &str, gpu: &str) -> String {
    let run = std::process::Command::new("sh")
        .args(["-c", &format!("{text}\n{then}")])
        .env("GDX_NIC_MAP_GPU", gpu)
        .env_remove("LOCAL_RANK")
        .env_remove("NCCL_IB_HCA")
        .env_remove("UCX_NET_DEVICES")
        .env_remove("MC_MS_FILTERS")
        .env_remove("MC_MS_AUTO_DISC")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).unwrap()
}

#[test]
fn json_gives_every_ndv4_gpu_a_pix_nic() {
    let xml = gdx_topo::fixture::reference_topologies().join("nccl_topo_azure_ndv4-topo.xml");
    let out = gdx()
        .args(["topo", "--nic-map", "--json", "--xml"])
        .arg(&xml)
        .output()
        .unwrap();
    let v = success_json(&out);
    assert_eq!(v["schema_version"], 1);
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for g in gpus {
        assert_eq!(g["use"][0]["class"], "PIX", "{g}");
        assert_eq!(g["ranked"].as_array().unwrap().len(), 8, "{g}");
    }
    assert_eq!(v["numa"].as_array().unwrap().len(), 4);
    assert!(v["nixl"].as_str().unwrap().contains("UCX_NET_DEVICES"));
}

#[test]
fn shell_text_sets_the_chosen_gpus_nics_in_sh() {
    let dir = tempfile::tempdir().unwrap();
    two_rails(dir.path());
    let out = gdx()
        .args(["topo", "--nic-map", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = success_text(&out);
    for (gpu, want) in [
        ("0", "=mlx5_0:1|mlx5_0:1|mlx5_0|1"),
        ("1", "=mlx5_1:1|mlx5_1:1|mlx5_1|1"),
    ] {
        let got = sh(
            &text,
            r#"printf '%s|%s|%s|%s' "$NCCL_IB_HCA" "$UCX_NET_DEVICES" "$MC_MS_FILTERS" "$MC_MS_AUTO_DISC""#,
            gpu,
        );
        assert_eq!(got, want, "GPU{gpu}:\n{text}");
    }
}

#[test]
fn shell_text_of_an_unnamed_capture_is_valid_sh_that_sets_nothing() {
    let xml = gdx_topo::fixture::reference_topologies().join("nccl_topo_aws_p4d-24xl-topo.xml");
    let out = gdx()
        .args(["topo", "--nic-map", "--xml"])
        .arg(&xml)
        .output()
        .unwrap();
    let text = success_text(&out);
    assert!(text.contains("# GPU0 "), "{text}");
    assert_eq!(
        sh(&text, r#"printf '%s' "${NCCL_IB_HCA-unset}""#, "3"),
        "unset"
    );
}

#[test]
fn nic_map_refuses_p2p() {
    common::refused(gdx().args(["topo", "--nic-map", "--p2p"]).assert(), "--p2p");
}
