//! A target counts what peers moved into and out of its regions, exactly, by peer and path
//! (issue 42 row 11: a peer wrote 5 MiB into `gdx serve` and its `/metrics` showed 0).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{Access, Agent, AgentConfig, Path, Transfer, Transports};

fn no_rdma(name: &str, shm: bool) -> Agent {
    Agent::new(AgentConfig {
        transports: Transports {
            tcp: true,
            shm,
            rdma: false,
            fabric: false,
        },
        ..config(name, shm)
    })
    .unwrap()
}

fn served(target: &Agent, peer: &str, path: &str, direction: &str) -> (u64, u64) {
    target
        .served()
        .iter()
        .filter(|s| s.peer == peer && s.path == path && s.direction == direction)
        .fold((0, 0), |(b, o), s| (b + s.bytes, o + s.ops))
}

#[test]
fn the_target_counts_what_peers_moved_exactly_on_tcp_and_shm() {
    for (shm, path, want) in [(false, "tcp", Path::Tcp), (true, "shm", Path::Shm)] {
        let target = no_rdma("target", shm);
        let r = target.alloc(4 << 20, Access::READ_WRITE, None).unwrap();
        let me = no_rdma("mover", shm);
        let peer = me.connect(target.listen_addr().unwrap()).unwrap();
        assert_eq!(peer.route().transport, want, "{}", peer.route().reason);
        let mut src = me.alloc(4 << 20, Access::LOCAL, None).unwrap();
        fill_pattern(&mut src.bytes_mut().unwrap(), 3);
        // A large write, a small one (the shm ring's inline path), and a read back.
        let mut t = Transfer::new();
        t.write(&src, 0, &r.desc(), 0, 3 << 20)
            .write(&src, 3 << 20, &r.desc(), 3 << 20, 100);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        let back = me.alloc(1 << 20, Access::LOCAL, None).unwrap();
        let mut t = Transfer::new();
        t.read(&back, 0, &r.desc(), 1 << 20, 1 << 20);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        let written = (3 << 20) + 100;
        assert_eq!(
            first_diff(
                &r.bytes().unwrap()[..written],
                &src.bytes().unwrap()[..written]
            ),
            None
        );
        assert_eq!(
            first_diff(
                &back.bytes().unwrap(),
                &src.bytes().unwrap()[1 << 20..2 << 20]
            ),
            None
        );
        let (wb, wo) = served(&target, "mover", path, "write");
        let (rb, ro) = served(&target, "mover", path, "read");
        assert_eq!(
            wb,
            written as u64,
            "{path}: bytes written, {:?}",
            target.served()
        );
        assert_eq!(rb, 1 << 20, "{path}: bytes read, {:?}", target.served());
        assert!(wo >= 2 && ro >= 1, "{path}: ops {wo} written, {ro} read");
        // Nothing is counted under another peer or path.
        let total: u64 = target.served().iter().map(|s| s.bytes).sum();
        assert_eq!(total, written as u64 + (1 << 20), "{:?}", target.served());
    }
}
