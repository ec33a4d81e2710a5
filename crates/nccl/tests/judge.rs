//! The judge over real logs and synthetic machines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use gdx_nccl::judge::{judge, Judged, Machine, Verdict};
use gdx_nccl::{parse_files, NcclLog};
use std::path::PathBuf;

fn log(name: &str) -> NcclLog {
    parse_files(&[PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)])
    .unwrap()
}

/// The judgement of fixture log `name` on `topo`, with no doctor findings.
fn judge_on(topo: &gdx_topo::Topology, name: &str) -> Judged {
    judge(
        &log(name),
        Machine {
            topology: Some(topo),
            findings: &[],
        },
    )
}

fn find<'a>(j: &'a Judged, subject: &str) -> &'a gdx_nccl::judge::Judgement {
    j.judgements
        .iter()
        .find(|x| x.subject == subject)
        .unwrap_or_else(|| panic!("no {subject:?} in {:#?}", j.judgements))
}

#[test]
fn gdr_disabled_on_a_pix_hca_is_not_best_and_on_a_sys_hca_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let topo = common::rail_machine(dir.path());
    let findings = common::doctor(dir.path());
    let j = judge(
        &log("gdr_disabled_roce_nccl1537.log"),
        Machine {
            topology: Some(&topo),
            findings: &findings,
        },
    );
    let m0 = find(&j, "GDR on mlx5_0");
    assert_eq!(m0.verdict, Verdict::NotBest, "{m0:#?}");
    assert_eq!(
        m0.best.as_deref(),
        Some("GPU0↔mlx5_0 is PIX: GDRDMA expected")
    );
    assert!(
        m0.why.iter().any(|w| w.starts_with("doctor peermem")),
        "{:?}",
        m0.why
    );
    assert!(m0.fix.is_some());
    let m1 = find(&j, "GDR on mlx5_1");
    assert_eq!(m1.verdict, Verdict::Best, "{m1:#?}");
    assert_eq!(j.exit_code(), 1);
    assert_eq!(j.judgements[0].verdict, Verdict::NotBest, "not-best first");
}

#[test]
fn without_a_topology_nothing_is_called_not_best() {
    let j = judge(
        &log("gdr_disabled_no_module_nccl899.log"),
        Machine {
            topology: None,
            findings: &[],
        },
    );
    assert_eq!(j.exit_code(), 0);
    let net = find(&j, "inter-node: NET/IB without GDRDMA");
    assert_eq!(net.verdict, Verdict::Unknown);
    assert!(
        net.why.iter().any(|w| w.contains("no peer-memory module")),
        "{:?}",
        net.why
    );
    assert!(j.notes.iter().any(|n| n.contains("no topology")));
}

#[test]
fn p2p_and_gdrdma_are_the_best() {
    let j = judge(
        &log("p2p_cumem_gdrdma_h20_nccl1189.log"),
        Machine {
            topology: None,
            findings: &[],
        },
    );
    assert_eq!(
        find(&j, "GPU↔GPU same host: P2P/CUMEM").verdict,
        Verdict::Best
    );
    assert_eq!(find(&j, "inter-node: NET/IB/GDRDMA").verdict, Verdict::Best);
    assert_eq!(j.exit_code(), 0);
}

#[test]
fn shm_between_gpus_behind_one_switch_is_not_best() {
    let dir = tempfile::tempdir().unwrap();
    let topo = common::two_gpu_switch_machine(dir.path());
    let j = judge_on(&topo, "socket_shm_mpirun_nccl1232.log");
    let shm = find(&j, "GPU↔GPU same host: SHM/direct/direct");
    assert_eq!(shm.verdict, Verdict::NotBest, "{shm:#?}");
    assert_eq!(shm.best.as_deref(), Some("GPU1↔GPU0 is PIX: P2P expected"));
    // No RDMA NIC on this machine: sockets are all there is.
    assert_eq!(find(&j, "inter-node: NET/Socket").verdict, Verdict::Best);
}

#[test]
fn sockets_on_a_machine_with_rdma_nics_are_not_best() {
    let dir = tempfile::tempdir().unwrap();
    let topo = common::rail_machine(dir.path());
    let j = judge_on(&topo, "socket_shm_mpirun_nccl1232.log");
    let s = find(&j, "inter-node: NET/Socket");
    assert_eq!(s.verdict, Verdict::NotBest);
    assert_eq!(
        s.best.as_deref(),
        Some("RDMA NICs mlx5_0, mlx5_1: NET/IB expected")
    );
}

#[test]
fn environment_overrides_from_the_log_are_judged_with_the_doctors_rules() {
    let j = judge(
        &log("p2p_disabled_socket_returnn1469.log"),
        Machine {
            topology: None,
            findings: &[],
        },
    );
    let p = find(&j, "NCCL_P2P_LEVEL=LOC");
    assert!(p.nccl_did.contains("disables GPU peer-to-peer"), "{p:#?}");
    assert_eq!(find(&j, "NCCL_IB_DISABLE=1").verdict, Verdict::Info);
}

#[test]
fn nvls_and_topology_file_are_reported_as_context() {
    let j = judge(
        &log("vm_topo_file_ncv4_azhpc327.log"),
        Machine {
            topology: None,
            findings: &[],
        },
    );
    assert_eq!(
        find(&j, "topology file").nccl_did,
        "NCCL read NCCL_TOPO_FILE=/opt/microsoft/ncv4/topo.xml"
    );
    let j = judge(
        &log("p2p_cumem_nvls_roce_nccl1538.log"),
        Machine {
            topology: None,
            findings: &[],
        },
    );
    assert!(find(&j, "NVLS")
        .nccl_did
        .contains("available on 5 device(s)"));
}

#[test]
fn an_nccl_xml_without_hca_names_is_matched_through_the_ranks_gpu() {
    let xml = r#"<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:1a:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:1c:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>
      <pci busid="0000:1d:00.0" class="0x020700" link_speed="32.0 GT/s PCIe" link_width="16"/>
    </pci>
  </cpu>
</system>"#;
    let topo = gdx_topo::parse_nccl_xml(xml, std::path::Path::new("test.xml")).unwrap();
    let j = judge_on(&topo, "gdr_disabled_roce_nccl1537.log");
    let m0 = find(&j, "GDR on mlx5_0");
    assert_eq!(m0.verdict, Verdict::NotBest, "{m0:#?}");
    assert!(
        m0.best
            .as_deref()
            .unwrap()
            .contains("GPU0's nearest NIC (NIC0 0000:1d:00.0) is PIX"),
        "{m0:#?}"
    );
    assert_eq!(j.exit_code(), 1);
}
