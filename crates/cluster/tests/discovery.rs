//! Discovery against a real etcd: publish and look up, name collisions, no key in etcd,
//! crash (kill -9) and stall (lease expiry) of a peer, restart under the same name.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::*;
use gdx_cluster::{ClusterError, ClusterView, EtcdOptions, LEASE_EXPIRED};
use gdx_engine::{Access, Error, Transfer};

#[test]
#[ignore = "a role: run as a child process by the tests of this file"]
fn role_agent() {
    child_role();
}

/// Every raw value under `/gdx/` (keys and values), read with a plain etcd client.
fn raw_etcd(url: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([url], None)
            .await
            .expect("connect");
        let r = c
            .get("/gdx/", Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .expect("get");
        r.kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect()
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn publish_lookup_connect_and_no_key_in_etcd() {
    let etcd = etcd();
    let url = etcd.url();
    let (a, mut kv) = join_with_kv(&url, "c1", 10, 1 << 20);
    let b = join(&url, "c1", "b", 10);

    let view = ClusterView::connect(&EtcdOptions::new(&url), "c1").expect("view");
    let rec = view.lookup("a").expect("lookup a");
    assert_eq!(rec.instance, a.instance());
    assert_eq!(
        rec.listen,
        a.agent().listen_addr().expect("listen").to_string()
    );
    let agents = view.agents().expect("agents");
    let names: Vec<_> = agents.iter().map(|l| l.agent.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(agents[0].regions.len(), 1);
    assert_eq!(agents[0].regions[0].name, "kv");
    assert_eq!(agents[0].regions[0].len, 1 << 20);
    assert!(agents[0].ttl_left_s > 0, "{:?}", agents[0]);

    // No usable key in etcd: neither the region key's bytes nor its hex appear anywhere.
    let desc = kv.desc();
    let key = desc.key.0;
    let raw = raw_etcd(&url);
    assert!(raw.len() >= 3, "{raw:?}");
    for (k, v) in &raw {
        for hay in [k, v] {
            assert!(!contains(hay, &key.to_le_bytes()), "key bytes at {k:?}");
            assert!(!contains(hay, &key.to_be_bytes()), "key bytes at {k:?}");
            assert!(
                !contains(hay, format!("{key:032x}").as_bytes()),
                "key hex at {k:?}"
            );
            assert!(
                !contains(hay, key.to_string().as_bytes()),
                "key digits at {k:?}"
            );
        }
    }

    // A peer gets the keyed descriptor over its authenticated session, and it works.
    let pa = b.connect_named("a").expect("connect_named");
    assert_eq!(pa.instance(), a.instance());
    let remote = pa.region("kv").expect("region");
    assert_eq!(remote.key, desc.key);
    let (src, src_bytes) = filled_source(&b, 1 << 20, 7);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 1 << 20);
    let rep = complete(&pa, t, "wait");
    assert_eq!(rep.bytes, 1 << 20);
    assert_eq!(&kv.bytes_mut().expect("bytes")[..], &src_bytes[..]);

    // Clean leave revokes the lease: the keys go at once.
    a.leave().expect("leave");
    assert!(matches!(
        view.lookup("a"),
        Err(ClusterError::NoSuchAgent { .. })
    ));
    assert!(!raw_etcd(&url)
        .iter()
        .any(|(k, _)| contains(k, b"/regions/a/")));
}

#[test]
fn name_collision_names_the_holder() {
    let etcd = etcd();
    let url = etcd.url();
    let first = join(&url, "c2", "prefill-3", 10);
    let agent = gdx_engine::Agent::new(agent_config("prefill-3")).expect("agent");
    let err = gdx_cluster::ClusterAgent::join(agent, cluster_config(&url, "c2", 10))
        .expect_err("second agent of one name");
    match &err {
        ClusterError::NameTaken {
            name,
            holder_instance,
            holder_listen,
            ..
        } => {
            assert_eq!(name, "prefill-3");
            assert_eq!(holder_instance, &first.instance());
            assert_eq!(
                holder_listen,
                &first.agent().listen_addr().expect("listen").to_string()
            );
        }
        e => panic!("expected NameTaken, got {e}"),
    }
    assert!(err.to_string().contains(&first.instance()), "{err}");
    // The holder is untouched.
    let view = ClusterView::connect(&EtcdOptions::new(&url), "c2").expect("view");
    assert_eq!(
        view.lookup("prefill-3").expect("lookup").instance,
        first.instance()
    );
}

/// Connects to `name` and fetches its region, then stops the process (so the write that
/// follows stays in flight) and submits a 64 MiB write to it.
fn stalled_write(
    b: &gdx_cluster::ClusterAgent,
    name: &str,
    child: &ChildAgent,
) -> gdx_cluster::NamedTransfer {
    let p = b.connect_named(name).expect("connect_named");
    assert_eq!(p.instance(), child.instance);
    let remote = p.region("kv").expect("region");
    let src = b.agent().alloc(64 << 20, Access::LOCAL, None).expect("src");
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 64 << 20);
    child.signal(rustix::process::Signal::STOP);
    p.submit(t).expect("submit")
}

#[test]
fn kill_9_drops_keys_within_ttl_and_fails_in_flight_transfer() {
    let etcd = etcd();
    let url = etcd.url();
    let ttl = 3;
    let child = spawn_child("role_agent", &url, "c3", "victim", ttl);
    let b = join(&url, "c3", "b", 10);
    // The child is stopped first so the 64 MiB write is still in flight when it dies.
    let x = stalled_write(&b, "victim", &child);
    assert!(matches!(x.handle().status(), gdx_engine::Status::Pending));
    child.signal(rustix::process::Signal::KILL);
    let killed = std::time::Instant::now();
    match x.wait(Duration::from_secs(60)) {
        Err(Error::PeerLost { .. }) => {}
        r => panic!("expected PeerLost, got {r:?}"),
    }
    let view = ClusterView::connect(&EtcdOptions::new(&url), "c3").expect("view");
    wait_for(
        "the killed agent's keys to go",
        Duration::from_secs(ttl as u64 + 2).saturating_sub(killed.elapsed()),
        || !raw_etcd(&url).iter().any(|(k, _)| contains(k, b"/victim")),
    );
    assert!(matches!(
        view.lookup("victim"),
        Err(ClusterError::NoSuchAgent { .. })
    ));
}

#[test]
fn lease_expiry_fails_in_flight_transfer_with_peer_lost() {
    let etcd = etcd();
    let url = etcd.url();
    let child = spawn_child("role_agent", &url, "c4", "stuck", 2);
    let b = join(&url, "c4", "b", 10);
    // A stopped process keeps its sockets open: only the lease says it is gone.
    let x = stalled_write(&b, "stuck", &child);
    match x.wait(Duration::from_secs(60)) {
        Err(Error::PeerLost { reason: m, .. }) => assert!(m.starts_with(LEASE_EXPIRED), "{m}"),
        r => panic!("expected PeerLost(lease expired), got {r:?}"),
    }
    child.signal(rustix::process::Signal::KILL);
}

#[test]
fn restart_same_name_new_instance_old_descriptors_refused() {
    let etcd = etcd();
    let url = etcd.url();
    let b = join(&url, "c5", "b", 10);
    let first = spawn_child("role_agent", &url, "c5", "worker", 2);
    let p1 = b.connect_named("worker").expect("connect 1");
    let old = p1.region("kv").expect("region 1");
    drop(first); // kill -9
    let view = ClusterView::connect(&EtcdOptions::new(&url), "c5").expect("view");
    wait_for(
        "the first instance's lease to end",
        Duration::from_secs(30),
        || view.lookup("worker").is_err(),
    );
    wait_for(
        "the old peer to be dropped",
        Duration::from_secs(30),
        || p1.lost().is_some(),
    );
    let second = spawn_child("role_agent", &url, "c5", "worker", 2);
    assert_ne!(second.instance, old_instance(&p1));
    // The old named peer refuses new work, and its cached descriptor is gone.
    let src = b.agent().alloc(4096, Access::LOCAL, None).expect("src");
    let mut t = Transfer::new();
    t.write(&src, 0, &old, 0, 4096);
    assert!(matches!(p1.submit(t), Err(Error::PeerLost { .. })));
    assert!(matches!(p1.region("kv"), Err(Error::PeerLost { .. })));
    // The new instance refuses the old descriptor (its key died with the old process).
    let p2 = b.connect_named("worker").expect("connect 2");
    assert_eq!(p2.instance(), second.instance);
    let mut t = Transfer::new();
    t.write(&src, 0, &old, 0, 4096);
    let r = p2.submit(t).and_then(|x| x.wait(Duration::from_secs(60)));
    assert!(
        matches!(
            r,
            Err(Error::BadKey { .. }) | Err(Error::NoSuchRegion { .. })
        ),
        "old descriptor against the new instance: {r:?}"
    );
    let new = p2.region("kv").expect("region 2");
    assert_ne!(new.key, old.key);
}

fn old_instance(p: &gdx_cluster::NamedPeer) -> String {
    p.instance().to_string()
}
