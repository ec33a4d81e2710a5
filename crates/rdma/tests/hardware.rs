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

use gdx_rdma::bench::{bench_rdma, serve_bench, BenchMem, BenchOp, BenchParams, TcpControl};
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
    let mut src: Vec<u8> = (0..8 << 20).map(|i| (i * 7) as u8).collect();
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
    assert!(matches!(a.post_write(&[w]), Err(RdmaError::Broken(_))));
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
    let gpu: u32 = std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let cuda = Cuda::load().unwrap();
    let ctx = Context::new(&cuda.device(gpu).unwrap()).unwrap();
    let buf = Arc::new(DeviceBuffer::new(&ctx, 4 << 20).unwrap());
    let mut src: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
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
fn bench_over_a_tcp_control_channel() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dev = nic();
    let dev2 = dev.clone();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        serve_bench(
            &mut TcpControl(s),
            Some(&dev2),
            &EndpointConfig::default(),
            T,
        )
    });
    let p = BenchParams {
        op: BenchOp::Write,
        local: BenchMem::Host,
        remote: BenchMem::Host,
        sizes: vec![4096, 1 << 20],
        iterations: 50,
        warmup: 5,
        samples: 3,
        device: Some(dev),
        ..BenchParams::default()
    };
    let r = bench_rdma(
        &mut TcpControl(std::net::TcpStream::connect(addr).unwrap()),
        &p,
    )
    .unwrap();
    server.join().unwrap().unwrap();
    eprintln!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert_eq!(r.key, "host_to_remote_host_rdma_write");
    assert_eq!(r.verified, Some(true));
    assert!(r.rows.iter().all(|row| row.bandwidth_median > 0.0));
}
