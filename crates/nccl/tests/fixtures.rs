//! Real NCCL INFO logs from public issue threads (see fixtures/SOURCES.md): each test asserts
//! the facts a person would read out of that log.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_nccl::model::{Direction, Scope, Transport};
use gdx_nccl::{parse_files, NcclLog};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn parse(name: &str) -> NcclLog {
    parse_files(&[fixture(name)]).unwrap()
}

fn class(log: &NcclLog, scope: Scope, transport: &str) -> gdx_nccl::model::PairClass {
    let all = log.pair_classes();
    all.iter()
        .find(|c| c.scope == scope && c.transport == transport)
        .cloned()
        .unwrap_or_else(|| panic!("no {scope} {transport} in {all:#?}"))
}

#[test]
fn gdr_disabled_for_each_roce_hca_nccl1537() {
    let log = parse("gdr_disabled_roce_nccl1537.log");
    let names: Vec<&str> = log.ib_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1"]);
    assert!(log
        .ib_devices
        .iter()
        .all(|d| d.link == "RoCE" && d.relaxed_ordering));
    assert_eq!(log.gdr.len(), 2);
    assert!(log.gdr.iter().all(|g| !g.enabled && g.net == "IB"));
    assert_eq!(log.gdr[1].name.as_deref(), Some("mlx5_1"));
    let r = &log.ranks[0];
    assert_eq!((r.rank, r.nranks, r.cuda_dev), (0, Some(16), Some(0)));
    assert_eq!(r.bus_id.as_deref(), Some("1c000"));
    assert_eq!(r.host.as_deref(), Some("hostname1"));
    assert_eq!(log.networks[0].value, "IB");
    assert!(log.parse_warnings.is_empty(), "{:?}", log.parse_warnings);
}

#[test]
fn no_module_and_net_ib_without_gdrdma_across_two_hosts_nccl899() {
    let log = parse("gdr_disabled_no_module_nccl899.log");
    assert!(log
        .gdr
        .iter()
        .all(|g| g.reason.as_deref() == Some("no module")));
    assert_eq!(log.gdr.iter().map(|g| g.hca).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(log.hosts().len(), 2);
    let c = class(&log, Scope::InterNode, "NET/IB without GDRDMA");
    assert!(!c.scope_assumed, "both hosts print their own end");
    assert_eq!(c.pairs, 2);
    assert_eq!(c.channels, 4, "channels 00 and 01, both directions");
    assert_eq!(log.rank_bus_id(1).as_deref(), Some("1a000"));
}

#[test]
fn gdrdma_on_several_hcas_old_wording_nccl707() {
    let log = parse("gdr_enabled_a100_nccl707.log");
    // Every rank printed its own end from the same host: NCCL went through the NICs between
    // GPUs of one machine (P2P unavailable there), which the summary must say.
    let c = class(&log, Scope::SameHost, "NET/IB/GDRDMA");
    assert!(!c.scope_assumed);
    assert_eq!(c.nics, ["NET/IB/0", "NET/IB/2", "NET/IB/4", "NET/IB/5"]);
    assert!(log.connections.iter().all(|c| c.from.bus_id.is_some()));
    assert_eq!(log.rank_bus_id(3).as_deref(), Some("ca000"));
}

#[test]
fn p2p_cumem_same_host_and_gdrdma_between_hosts_nccl1189() {
    let log = parse("p2p_cumem_gdrdma_h20_nccl1189.log");
    let p2p = class(&log, Scope::SameHost, "P2P/CUMEM");
    assert_eq!(p2p.channels, 5);
    let net = class(&log, Scope::InterNode, "NET/IB/GDRDMA");
    assert_eq!(net.nics, ["NET/IB/2", "NET/IB/3"]);
    // The last line is cut mid-word in the thread: a warning, not a panic.
    assert_eq!(log.parse_warnings.len(), 1, "{:?}", log.parse_warnings);
    assert!(log.parse_warnings[0].message.contains("truncated"));
    assert_eq!(log.parse_warnings[0].line, 15);
}

#[test]
fn eight_roce_hcas_nvls_and_p2p_cumem_nccl1538() {
    let log = parse("p2p_cumem_nvls_roce_nccl1538.log");
    let names: Vec<&str> = log.ib_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names.len(), 8, "{names:?}");
    assert_eq!(log.networks[0].value, "IBext_v8");
    assert_eq!(
        log.nvls.available_on.iter().copied().collect::<Vec<_>>(),
        [0, 2, 5, 6, 7]
    );
    let c = class(&log, Scope::SameHost, "P2P/CUMEM");
    assert_eq!(c.pairs, 4);
}

#[test]
fn prefixless_log_with_version_sharp_and_nvls_nccl1584() {
    let log = parse("nvls_ib_sharp_nccl1584.log");
    assert_eq!(log.version.as_deref(), Some("2.24.3+cuda12.2"));
    assert_eq!(log.ib_devices.len(), 8);
    assert!(log.collnet.sharp_devices);
    assert_eq!(log.collnet.plugin.as_deref(), Some("SHARP (v8)"));
    assert!(log.nvls.available_on.contains(&0));
    assert_eq!(
        log.env.get("NCCL_SOCKET_IFNAME").map(String::as_str),
        Some("eth0")
    );
    assert_eq!(
        log.env
            .get("NCCL_IB_PCI_RELAXED_ORDERING")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(log.ranks[0].bus_id.as_deref(), Some("1a000"));
    assert_eq!(log.ranks[0].nranks, Some(8));
}

#[test]
fn socket_fallback_with_mpirun_tags_and_shm_nccl1232() {
    let log = parse("socket_shm_mpirun_nccl1232.log");
    let net = class(&log, Scope::InterNode, "NET/Socket");
    assert!(net.channels >= 4);
    let shm = class(&log, Scope::SameHost, "SHM/direct/direct");
    assert_eq!(shm.channels, 2);
    assert_eq!(log.nvls.channels, Some(0));
    assert!(log
        .connections
        .iter()
        .any(|c| c.direction == Some(Direction::Receive) && c.host.as_deref() == Some("node2")));
    assert_eq!(
        log.env.get("NCCL_SOCKET_IFNAME").map(String::as_str),
        Some("en,eth,em,bond")
    );
}

#[test]
fn socket_because_no_libibverbs_and_shm_between_gpus_nccl1817() {
    let log = parse("socket_shm_l20_nccl1817.log");
    assert_eq!(log.version.as_deref(), Some("2.20.5+cuda12.4"));
    assert!(log.ib_unavailable[0]
        .value
        .starts_with("Failed to open libibverbs"));
    assert_eq!(log.sockets[0].name, "eth0");
    assert_eq!(log.networks[0].value, "Socket");
    let shm = class(&log, Scope::SameHost, "SHM/direct/direct");
    assert_eq!(shm.channels, 11);
}

#[test]
fn p2p_level_loc_and_ib_disabled_returnn1469() {
    let log = parse("p2p_disabled_socket_returnn1469.log");
    assert_eq!(
        log.env.get("NCCL_P2P_LEVEL").map(String::as_str),
        Some("LOC")
    );
    assert_eq!(
        log.env.get("NCCL_IB_DISABLE").map(String::as_str),
        Some("1")
    );
    assert_eq!(log.sockets[0].name, "ib0");
    assert_eq!(log.hosts().into_iter().collect::<Vec<_>>(), ["ncg12"]);
    assert!(log.parse_warnings.is_empty(), "{:?}", log.parse_warnings);
}

#[test]
fn topology_file_in_a_vm_and_nccl_warn_azhpc327() {
    let log = parse("vm_topo_file_ncv4_azhpc327.log");
    assert_eq!(
        log.topo_file.as_deref(),
        Some("/opt/microsoft/ncv4/topo.xml")
    );
    assert_eq!(
        log.graph_file.as_deref(),
        Some("/opt/microsoft/ncv4/graph.xml")
    );
    assert_eq!(log.version.as_deref(), Some("2.18.6+cuda11.8"));
    assert_eq!(log.ranks[0].bus_id.as_deref(), Some("100000"));
    assert_eq!(log.nccl_warnings.len(), 1);
    assert!(log.nccl_warnings[0].value.contains("dev 1 not found"));
    assert_eq!(log.ranks[0].host.as_deref(), Some(""));
}

#[test]
fn vm_system_print_shows_the_tiny_pci_bridge_nccltests256() {
    let log = parse("vm_h200_system_nccltests256.log");
    let s = log.system.unwrap();
    assert_eq!(s.max_bw, Some(48.0));
    assert_eq!(s.total_bw, Some(370.8));
    assert_eq!(s.min_pci_bw, Some(0.2));
}

#[test]
fn pre_2_12_per_gpu_gdr_wording_dle383() {
    let log = parse("gdr_level_old_format_dle383.log");
    let disabled: Vec<_> = log.gdr.iter().filter(|g| !g.enabled).collect();
    assert!(disabled
        .iter()
        .any(|g| g.gpu_bus_id.as_deref() == Some("18000")
            && g.reason.as_deref() == Some("distance 5 > 4")));
    assert!(log
        .gdr
        .iter()
        .any(|g| g.enabled && g.gpu_bus_id.as_deref() == Some("86000")));
    assert_eq!(
        log.env.get("NCCL_NET_GDR_LEVEL").map(String::as_str),
        Some("PHB")
    );
}

#[test]
fn nvls_unavailable_between_timestamp_lines_awsofi715() {
    let log = parse("nvls_unavailable_timestamps_awsofi715.log");
    assert_eq!(
        log.nvls.unavailable_on.iter().copied().collect::<Vec<_>>(),
        [2, 5, 6, 7]
    );
    assert!(log.nvls.available_on.is_empty());
}

#[test]
fn gid_index_from_env_and_plugin_net_nccl1814() {
    let log = parse("roce_gid_index_ibext_nccl1814.log");
    assert_eq!(
        log.env.get("NCCL_IB_GID_INDEX").map(String::as_str),
        Some("3")
    );
    let net = class(&log, Scope::InterNode, "NET/IBext_v8 without GDRDMA");
    assert!(
        net.scope_assumed,
        "only the receiving host printed; the sender's host is inferred"
    );
    assert!(log.connections.iter().any(
        |c| matches!(&c.transport, Transport::Net { plugin, dev: 2, .. } if plugin == "IBext_v8")
    ));
}

#[test]
fn all_fixture_files_together_parse_as_one_job() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    assert!(files.len() >= 8);
    let log = parse_files(&files).unwrap();
    assert_eq!(log.sources.len(), files.len());
    assert!(log
        .parse_warnings
        .iter()
        .any(|w| w.message.contains("several NCCL versions")));
}
