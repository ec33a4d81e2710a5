//! Loader tests. They pass both with and without libcuda: without it `load` must be an
//! `Unavailable` naming what was tried; with it, a handle with sane values.

use super::*;
use crate::loader::testing::assert_names_every_candidate;
use gdx_base::testenv::test_gpu;

#[test]
fn load_returns_a_handle_or_names_every_candidate() {
    match Cuda::load() {
        Ok(cuda) => {
            assert!(!cuda.path().is_empty());
            assert!(cuda.driver_version().unwrap().major() >= 11);
            assert!(cuda.device_count().unwrap() >= 1);
        }
        Err(e) => {
            // Either no candidate opened (then every one is named) or cuInit failed.
            let init = Some("cuInit(0) failed");
            assert_names_every_candidate(&e, "libcuda.so.1", &default_candidates(), init);
            assert!(!Cuda::is_available());
        }
    }
}

#[test]
fn load_is_cached() {
    match (Cuda::load(), Cuda::load()) {
        (Ok(a), Ok(b)) => assert!(Arc::ptr_eq(&a.inner, &b.inner)),
        (Err(a), Err(b)) => assert_eq!(a, b),
        (a, b) => panic!("two loads disagree: {a:?} vs {b:?}"),
    }
}

#[test]
fn default_candidates_follow_cudarc_then_driver_dirs() {
    let c = default_candidates();
    // cudarc's list, first occurrences only (it repeats some names): the first that opens is
    // the file cudarc's own loader would pick.
    let mut cudarc: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates("cuda") {
        if !cudarc.contains(&n) {
            cudarc.push(n);
        }
    }
    assert_eq!(&c[..cudarc.len()], &cudarc[..]);
    assert!(c.contains(&"libcuda.so.1".to_string()));
    assert!(c.contains(&"/usr/local/nvidia/lib64/libcuda.so.1".to_string()));
}

#[test]
fn bogus_path_is_unavailable_naming_the_path() {
    let bogus = "/nonexistent/gdx/libcuda.so.1";
    let e = Cuda::load_from(&[bogus]).unwrap_err();
    assert_eq!(e.library, "libcuda.so.1");
    assert!(e.reason.contains(bogus), "{}", e.reason);
}

#[test]
fn wrong_library_is_unavailable_naming_the_missing_symbols() {
    // libc opens fine but has none of the driver's symbols: an error, not a panic.
    let e = Cuda::load_from(&["libc.so.6"]).unwrap_err();
    assert_eq!(e.library, "libcuda.so.1");
    assert!(e.reason.contains("libc.so.6"), "{}", e.reason);
    assert!(e.reason.contains("cuInit"), "{}", e.reason);
    assert!(e.reason.contains("cuDeviceGetAttribute"), "{}", e.reason);
    assert!(e.reason.contains("undefined symbol"), "{}", e.reason);
}

#[test]
fn versions_print_as_major_dot_minor() {
    assert_eq!(CudaVersion(13000).to_string(), "13.0");
    assert_eq!(CudaVersion(12090).to_string(), "12.9");
    assert_eq!(CudaVersion(11040).major(), 11);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gpu_reports_sane_values() {
    let cuda = Cuda::load().unwrap();
    let count = cuda.device_count().unwrap();
    assert!(count >= 1);
    let gpu = test_gpu();
    let dev = cuda.device(gpu).unwrap();
    let info = dev.info().unwrap();
    eprintln!(
        "{} CUDA {}: {info:?}",
        cuda.path(),
        cuda.driver_version().unwrap()
    );
    assert_eq!(info.ordinal, gpu);
    assert!(!info.name.is_empty());
    assert_eq!(
        info.pci_bus_id.matches(':').count(),
        2,
        "{}",
        info.pci_bus_id
    );
    assert!(info.pci_bus_id.contains('.'), "{}", info.pci_bus_id);
    assert!(info.total_memory_bytes >= 1 << 30);
    assert!(info.compute_capability.major >= 3);
    assert!(info.uuid.as_deref().unwrap().starts_with("GPU-"));
    assert!(info.gpu_direct_rdma.is_some());
    assert!(info.dma_buf.is_some());
    assert!(info.memory_pools.is_some());
    // Out of range ordinal: a typed error, not a driver call with a bad ordinal.
    assert_eq!(
        cuda.device(count).unwrap_err(),
        CudaError::NoSuchDevice {
            ordinal: count,
            count
        }
    );
    for peer in 0..count {
        if peer != gpu {
            let can = cuda.can_access_peer(gpu, peer).unwrap();
            eprintln!("GPU {gpu} -> GPU {peer}: can access peer = {can}");
        }
    }
    assert!(cuda.has_symbol("cuMemAlloc_v2"));
    assert!(!cuda.has_symbol("cuNoSuchFunction"));
}
