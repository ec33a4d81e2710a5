//! etcd killed mid-run: connected peers keep transferring, the agent's registration shows
//! lost, and it re-registers when etcd is back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::*;
use gdx_cluster::{ClusterView, EtcdOptions, LeaseState};
use gdx_engine::{Access, Transfer};

#[test]
fn etcd_loss_keeps_peers_working_and_re_registers() {
    let mut etcd = etcd();
    let url = etcd.url();
    let (a, kv) = join_with_kv(&url, "loss", 2, 1 << 20);
    let b = join(&url, "loss", "b", 2);
    let pa = b.connect_named("a").expect("connect_named");
    let remote = pa.region("kv").expect("region");
    assert!(a.lease_state().is_registered());

    etcd.kill();
    wait_for(
        "a to notice the lost registration",
        Duration::from_secs(60),
        || matches!(a.lease_state(), LeaseState::Lost { .. }),
    );

    // Transfers between connected peers continue, bytes verified both ways.
    let (src, data) = filled_source(&b, 1 << 20, 3);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 1 << 20);
    complete(&pa, t, "write during outage");
    assert_eq!(&kv.bytes().expect("bytes")[..], &data[..]);
    let back = b.agent().alloc(1 << 20, Access::LOCAL, None).expect("back");
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 0, 1 << 20);
    complete(&pa, t, "read during outage");
    assert_eq!(&back.bytes().expect("bytes")[..], &data[..]);

    etcd.restart().expect("etcd restart");
    wait_for("a to re-register", Duration::from_secs(60), || {
        a.lease_state().is_registered()
    });
    let view = ClusterView::connect(&EtcdOptions::new(&url), "loss").expect("view");
    wait_for("a's record back in etcd", Duration::from_secs(60), || {
        view.lookup("a")
            .map(|r| r.instance == a.instance())
            .unwrap_or(false)
    });
    let listing = view.agents().expect("agents");
    let la = listing
        .iter()
        .find(|l| l.agent.name == "a")
        .expect("a listed");
    assert_eq!(la.regions.len(), 1, "{la:?}");
    // The outage was not a leave: b still holds its peer.
    assert_eq!(pa.lost(), None);
}
