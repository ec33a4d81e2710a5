//! Tests that need an RDMA NIC (and, for the GPU ones, a GPU near it). No machine available
//! to the project has one, so they are ignored by default and have never run. Run them with
//!
//! ```text
//! GDX_TEST_NIC=mlx5_0 [GDX_TEST_GPU=0] cargo test -p gdx-rdma --test hardware -- --ignored
//! ```
//!
//! Each connects two sets of queue pairs on the same port to each other (loopback), so one
//! machine with one active port suffices (Soft-RoCE works too where the kernel has rxe).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::link::{pattern_checksum, LinkMem, Side};
use gdx_rdma::{
    EndpointConfig, Mechanism, Memory, MrHandle, Qp, RdmaEndpoint, RdmaError, RdmaOp, RemoteRegion,
    WorkItem,
};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn nic() -> String {
    std::env::var("GDX_TEST_NIC").unwrap_or_else(|_| {
        gdx_rdma::discover()
            .expect("no RDMA device: set GDX_TEST_NIC")
            .remove(0)
            .name
    })
}

fn loopback(ep: &RdmaEndpoint, advertise: Vec<RemoteRegion>) -> (Qp, Qp) {
    let cq = ep.completion_queue(2048).unwrap();
    let a = ep.prepare(&cq, 2).unwrap();
    let mut b = ep.prepare(&cq, 2).unwrap();
    b.advertise(advertise);
    let (da, db) = (a.conn_data().clone(), b.conn_data().clone());
    // The data each side sends goes through the binary form, as in the engine's handshake.
    let da = gdx_rdma::ConnData::decode(&da.encode().unwrap()).unwrap();
    let db = gdx_rdma::ConnData::decode(&db.encode().unwrap()).unwrap();
    (a.connect(&db).unwrap(), b.connect(&da).unwrap())
}

fn host(ep: &RdmaEndpoint, v: &mut [u8]) -> MrHandle {
    // SAFETY: every test keeps its vectors alive until the endpoint (and its cache) is gone,
    // and reads them only after the operations completed.
    ep.register(&unsafe { Memory::host(v.as_mut_ptr(), v.len()) })
        .unwrap()
}

#[test]
#[ignore = "requires an RDMA NIC; GDX_TEST_NIC=mlx5_0 cargo test -p gdx-rdma --test hardware -- --ignored"]
fn host_write_then_read_back_over_loopback() {
    let mut src = gdx_base::pattern::pattern(8 << 20, 7);
    let mut dst = vec![0u8; 8 << 20];
    let mut back = vec![0u8; 8 << 20];
    let ep = RdmaEndpoint::open(
        &nic(),
        EndpointConfig {
            chunk_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    eprintln!("{:?}", ep.gid());
    let (s, d, r) = (
        host(&ep, &mut src),
        host(&ep, &mut dst),
        host(&ep, &mut back),
    );
    assert_eq!(s.handle.mechanism(), Mechanism::HostMr);
    let remote = d.handle.remote_region(7).unwrap();
    let (mut a, _b) = loopback(&ep, vec![remote]);
    let target = a.remote().regions[0];
    let w = WorkItem::between(&s, 0, &target, 0, 8 << 20).unwrap();
    assert_eq!(a.run(RdmaOp::Write, &[w], T).unwrap(), 8 << 20);
    let rd = WorkItem::between(&r, 0, &target, 0, 8 << 20).unwrap();
    assert_eq!(a.run(RdmaOp::Read, &[rd], T).unwrap(), 8 << 20);
    drop((a, _b, s, d, r, ep));
    assert!(dst == src && back == src);
}

#[test]
#[ignore = "requires an RDMA NIC; GDX_TEST_NIC=mlx5_0 cargo test -p gdx-rdma --test hardware -- --ignored"]
fn a_wrong_rkey_is_a_remote_access_error_and_breaks_the_connection() {
    let mut src = vec![1u8; 4096];
    let mut dst = vec![0u8; 4096];
    let ep = RdmaEndpoint::open(&nic(), EndpointConfig::default()).unwrap();
    let (s, d) = (host(&ep, &mut src), host(&ep, &mut dst));
    let mut bad = d.handle.remote_region(1).unwrap();
    bad.rkey ^= 0x5a5a;
    let (mut a, _b) = loopback(&ep, vec![]);
    let w = WorkItem::between(&s, 0, &bad, 0, 4096).unwrap();
    let t = a.post_write(std::slice::from_ref(&w)).unwrap();
    let done = a.completion_queue().wait(t, T).unwrap();
    let e = done.first_error().expect("a wrong rkey must fail");
    assert!(e.is_remote_access(), "{e}");
    assert!(matches!(a.post_write(&[w]), Err(RdmaError::Broken { .. })));
}

#[test]
#[ignore = "requires an RDMA NIC; GDX_TEST_NIC=mlx5_0 cargo test -p gdx-rdma --test hardware -- --ignored"]
fn registration_cache_hits_on_the_real_device() {
    let mut v = vec![0u8; 1 << 20];
    let ep = RdmaEndpoint::open(&nic(), EndpointConfig::default()).unwrap();
    let a = host(&ep, &mut v);
    let b = host(&ep, &mut v[4096..8192]);
    assert!(Arc::ptr_eq(&a, &b));
    let s = ep.cache_stats();
    assert_eq!((s.hits, s.misses), (1, 1));
    eprintln!("registering 1 MiB took {:?}", s.register_time);
}

#[test]
#[ignore = "requires an RDMA NIC and a GPU; GDX_TEST_NIC=mlx5_0 GDX_TEST_GPU=0 cargo test -p gdx-rdma --test hardware -- --ignored"]
fn gpu_memory_registers_by_dmabuf_or_peermem_and_moves_data() {
    use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, PinnedHostBuffer, Stream};
    let gpu = gdx_base::testenv::test_gpu();
    let cuda = Cuda::load().unwrap();
    let ctx = Context::new(&cuda.device(gpu).unwrap()).unwrap();
    let buf = Arc::new(DeviceBuffer::new(&ctx, 4 << 20).unwrap());
    let mut src = gdx_base::pattern::pattern(4 << 20, 251);
    let ep = RdmaEndpoint::open(
        &nic(),
        EndpointConfig {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap();
    let g = ep.register(&Memory::gpu(Arc::clone(&buf))).unwrap();
    eprintln!(
        "GPU {gpu} on {}: {} (tried {:?})",
        ep.device(),
        g.handle.mechanism(),
        g.handle.attempts()
    );
    assert!(matches!(
        g.handle.mechanism(),
        Mechanism::DmaBuf | Mechanism::PeerMem
    ));
    let s = host(&ep, &mut src);
    let (mut a, _b) = loopback(&ep, vec![g.handle.remote_region(3).unwrap()]);
    let target = a.remote().regions[0];
    let w = WorkItem::between(&s, 0, &target, 0, 4 << 20).unwrap();
    a.run(RdmaOp::Write, &[w], T).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut out = PinnedHostBuffer::new(&ctx, 4 << 20).unwrap();
    stream.copy_to_host(&mut out, &buf).unwrap();
    assert!(out.as_slice().unwrap() == src.as_slice());
}

#[test]
#[ignore = "requires an RDMA NIC; GDX_TEST_NIC=mlx5_0 cargo test -p gdx-rdma --test hardware -- --ignored"]
fn link_sides_write_the_pattern_into_the_peer() {
    let dev = nic();
    let cfg = EndpointConfig::default();
    let len = 1 << 20;
    let mut target = Side::open(LinkMem::Host, len, 2, Some(&dev), &cfg, 0).unwrap();
    let region = target.advertise_buffer().unwrap();
    let source = Side::open(LinkMem::Host, len, 1, Some(&dev), &cfg, 0).unwrap();
    let (src_data, dst_data) = (source.conn_data().clone(), target.conn_data().clone());
    let mut writer = source.connect(&dst_data).unwrap();
    let target = target.connect(&src_data).unwrap();
    assert_eq!(target.checksum(len), Some(pattern_checksum(len, 2)));
    let moved = writer
        .run(RdmaOp::Write, &region, len as u64, 3, T)
        .unwrap();
    assert_eq!(moved, 3 * len as u64);
    assert_eq!(target.checksum(len), Some(pattern_checksum(len, 1)));
}
