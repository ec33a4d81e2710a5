//! Discovery and the doctor calls through the real libibverbs of this machine (whatever it
//! has: no library, a library without devices, or devices). On CI and the GPU test machine
//! there is no RDMA device, so these check the "unavailable, and why" answers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::discovery::{discover, UnavailableKind};
use gdx_rdma::doctor;
use gdx_rdma::{EndpointConfig, RdmaEndpoint, RdmaError};

#[test]
fn discovery_lists_devices_or_says_why_not() {
    let lib = gdx_sys::verbs::probe();
    eprintln!("libibverbs: {lib:?}");
    match discover() {
        Ok(devs) => {
            assert!(!devs.is_empty());
            for d in &devs {
                eprintln!("{}: {} port(s)", d.name, d.ports.len());
            }
        }
        Err(e) => {
            eprintln!("{e}");
            assert!(!e.reason.is_empty());
            match lib {
                Ok(_) => assert_ne!(e.kind, UnavailableKind::NoLibrary, "{e}"),
                Err(_) => assert_eq!(e.kind, UnavailableKind::NoLibrary, "{e}"),
            }
        }
    }
}

#[test]
fn doctor_calls_answer_without_a_device() {
    eprintln!("has ibv_reg_dmabuf_mr: {:?}", doctor::has_reg_dmabuf_mr());
    if gdx_sys::verbs::probe().is_err() {
        assert_eq!(doctor::has_reg_dmabuf_mr(), None);
    }
    let devs = doctor::rdma_devices().unwrap_or_default();
    for d in &devs {
        eprintln!(
            "{}: dma-buf {}",
            d.name,
            doctor::dmabuf_kernel_support(&d.name)
        );
    }
    let mtus = doctor::port_mtus(&devs, std::path::Path::new("/"));
    eprintln!("{mtus:?}");
    if devs.is_empty() {
        assert!(mtus.is_empty());
        // The active probe stops at discovery: no GPU is touched.
        assert!(matches!(
            doctor::probe_gpu_registration(0, 1 << 20),
            Err(RdmaError::Unavailable(_))
        ));
    }
}

#[test]
fn opening_an_endpoint_without_a_device_is_unavailable() {
    if !gdx_base::testenv::precondition("no RDMA device", discover().is_err()) {
        return;
    }
    let e = RdmaEndpoint::open("mlx5_0", EndpointConfig::default()).unwrap_err();
    eprintln!("{e}");
    assert!(matches!(e, RdmaError::Unavailable(_)), "{e:?}");
}

#[test]
fn every_named_status_is_known_to_the_loaded_libibverbs() {
    use gdx_rdma::WcStatus;
    if !gdx_base::testenv::precondition("libibverbs", gdx_sys::verbs::probe().is_ok()) {
        return;
    }
    for code in 0..24 {
        let s = WcStatus::from_code(code);
        let text = gdx_sys::verbs::wc_status_str(code).unwrap();
        eprintln!("{s}: {text}");
        assert!(!text.is_empty() && text != "unknown", "{code}: {text}");
    }
}
