//! The rdma transport where there is no RDMA device (CI and the GPU machine): agents do not offer
//! it, routes say why in words, and a peer that asks anyway gets a named refusal on a connection
//! that stays usable. (With a device the same code connects RC queue pairs: tests/rdma_vm.rs, run
//! on Soft-RoCE by scripts/test-rdma.sh.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::wire::{encode, Msg};
use gdx_engine::{Access, Agent, AgentConfig, Error, Path, RegionKey, Transports};
use std::io::{Read, Write};
use std::net::TcpStream;

fn far_agent(name: &str, rdma: bool) -> Agent {
    Agent::new(AgentConfig {
        host_id: Some(u128::from(name.len() as u32) << 64 | 0xabc),
        // shm on, but different host ids: the route must go between hosts.
        transports: Transports {
            tcp: true,
            shm: true,
            rdma,
            fabric: false,
        },
        ..config(name, false)
    })
    .unwrap()
}

fn has_rdma_device() -> bool {
    gdx_rdma::discover().is_ok()
}

#[test]
fn without_a_device_routes_say_why_rdma_was_not_used() {
    // With a device, the hardware test applies instead.
    if !gdx_base::testenv::precondition("no RDMA device", !has_rdma_device()) {
        return;
    }
    let target = far_agent("target", true);
    let me = far_agent("me-agent", true);
    let err = me.rdma_status().unwrap_err();
    // The verbs error stays the source, not only text.
    assert!(
        matches!(&err, gdx_engine::Error::Rdma(_)) && std::error::Error::source(&err).is_some(),
        "{err:?}"
    );
    let why = err.to_string();
    assert!(
        why.to_lowercase().contains("rdma") || why.contains("libibverbs"),
        "{why}"
    );
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let route = peer.route();
    assert_eq!(route.transport, Path::Tcp);
    assert!(route.reason.contains("another host"), "{}", route.reason);
    assert!(
        route.reason.contains("rdma: not offered here") && route.reason.contains(&why),
        "{}",
        route.reason
    );
    // Ops still run on tcp, and say so.
    let mut src = me.alloc(4096, Access::LOCAL, None).unwrap();
    src.bytes_mut().unwrap().fill(9);
    let dst = target.alloc(4096, Access::READ_WRITE, Some("d")).unwrap();
    let mut t = gdx_engine::Transfer::new();
    t.write(&src, 0, &peer.region("d").unwrap(), 0, 4096);
    let report = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(report.ops[0].plan.path, Path::Tcp);
    assert!(dst.bytes().unwrap().iter().all(|&b| b == 9));
}

#[test]
fn disabled_rdma_is_named_as_disabled() {
    let me = far_agent("me", false);
    let err = me.rdma_status().unwrap_err();
    assert!(
        matches!(err, gdx_engine::Error::Unavailable { .. }),
        "{err:?}"
    );
    let why = err.to_string();
    assert!(why.contains("disabled"), "{why}");
    let target = far_agent("target", true);
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    assert!(
        peer.route().reason.contains("disabled"),
        "{}",
        peer.route().reason
    );
}

fn read_reply(s: &mut TcpStream) -> Option<Msg> {
    let mut h = [0u8; gdx_engine::wire::HEADER_LEN];
    s.read_exact(&mut h).ok()?;
    let hdr = gdx_engine::wire::decode_header(&h).ok()?;
    let mut body = vec![0u8; hdr.body_len as usize];
    s.read_exact(&mut body).ok()?;
    gdx_engine::wire::decode_body(hdr.kind, &body).ok()
}

#[test]
fn rdma_requests_to_an_agent_without_rdma_are_refused_by_name() {
    if !gdx_base::testenv::precondition("no RDMA device", !has_rdma_device()) {
        return;
    }
    let target = far_agent("target", true);
    let rw = target.alloc(64, Access::READ_WRITE, Some("rw")).unwrap();
    let raw::Session {
        control: mut c,
        hello: h,
        ..
    } = raw::login(
        target.listen_addr().unwrap(),
        target.secret().unwrap().as_bytes(),
    );
    assert_eq!(
        h.transports & 4,
        0,
        "an agent without a device must not offer rdma"
    );
    c.write_all(&encode(
        &Msg::RdmaConnect {
            data: vec![1, 2, 3],
        },
        0,
    ))
    .unwrap();
    match read_reply(&mut c) {
        Some(Msg::Err(Error::Unavailable {
            path: Some(Path::Rdma),
            why: m,
        })) => assert!(m.starts_with("rdma: "), "{m}"),
        other => panic!("{other:?}"),
    }
    let d = rw.desc();
    c.write_all(&encode(
        &Msg::RdmaRegion {
            region: d.id,
            key: RegionKey(d.key.0 ^ 1),
            write: true,
        },
        0,
    ))
    .unwrap();
    assert!(matches!(
        read_reply(&mut c),
        Some(Msg::Err(Error::Unavailable { .. }))
    ));
    // The control connection is still in service.
    c.write_all(&encode(&Msg::GetRegion { name: "rw".into() }, 0))
        .unwrap();
    match read_reply(&mut c) {
        Some(Msg::Region(r)) => assert_eq!(r.id, d.id),
        other => panic!("{other:?}"),
    }
}
