//! The rdma bench over a real NIC: a client and the bench server (`gdx serve --rdma-listen`'s
//! [`serve`]) in one process, over a TCP control channel, on the same port (loopback). No
//! machine available to the project has an RDMA NIC, so this is ignored by default and has
//! never run:
//!
//! ```text
//! GDX_TEST_NIC=mlx5_0 cargo test -p gdx-bench --test rdma_hardware -- --ignored
//! ```
//!
//! Without `GDX_TEST_NIC` both sides take the NIC nearest to host memory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_bench::rdma::{run_client, serve, BenchMem, BenchOp, RdmaParams, TcpControl};
use gdx_rdma::EndpointConfig;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[test]
#[ignore = "requires an RDMA NIC; GDX_TEST_NIC=mlx5_0 cargo test -p gdx-bench --test rdma_hardware -- --ignored"]
fn bench_over_a_tcp_control_channel() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dev = std::env::var("GDX_TEST_NIC").ok();
    let dev2 = dev.clone();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        serve(
            &mut TcpControl(s),
            dev2.as_deref(),
            &EndpointConfig::default(),
            T,
        )
    });
    let p = RdmaParams {
        op: BenchOp::Write,
        local: BenchMem::Host,
        remote: BenchMem::Host,
        sizes: vec![4096, 1 << 20],
        iterations: 50,
        warmup: 5,
        samples: 3,
        device: dev,
        ..RdmaParams::default()
    };
    let r = run_client(
        &mut TcpControl(std::net::TcpStream::connect(addr).unwrap()),
        &p,
    )
    .unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(r.verified, Some(true));
    assert_eq!(r.sizes.len(), 2);
    assert!(r
        .sizes
        .iter()
        .all(|s| s.samples.len() == 3 && s.latencies.len() == 50));
    // The port's counters were read around every size (rxe exports 16, mlx5 more).
    for s in &r.sizes {
        let c = s.counters.as_ref().expect("counters read around the size");
        assert!(c.read > 0, "{c:?}");
    }
}
