//! Issue 42 row 5: someone who can write etcd points `/gdx/<cluster>/agents/a` at agent b (b's
//! address and instance, a's name). `connect_named("a")` used to accept b (the instance
//! matched, the name was never compared) and writes went into b. Now the connect fails with
//! an error naming the agent it reached, and nothing reaches b's region.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::Access;

#[test]
fn a_redirected_record_fails_naming_the_agent_reached() {
    let etcd = etcd();
    let url = etcd.url();
    let (a, _kv_a) = join_with_kv(&url, "r", 30, 1 << 16);
    let b_agent = gdx_engine::Agent::new(agent_config("b")).unwrap();
    let kv_b = b_agent
        .alloc(1 << 16, Access::READ_WRITE, Some("kv"))
        .unwrap();
    let b = gdx_cluster::ClusterAgent::join(b_agent, cluster_config(&url, "r", 30)).unwrap();
    let c = join(&url, "r", "c", 30);
    // Before: a is a.
    let pa = c.connect_named("a").expect("the genuine record connects");
    drop(pa);
    // The attacker rewrites a's record: b's address and instance under a's name.
    let view =
        gdx_cluster::ClusterView::connect(&gdx_cluster::EtcdOptions::new(&url), "r").unwrap();
    let mut forged = view.lookup("b").unwrap();
    forged.name = "a".into();
    etcd.put("/gdx/r/agents/a", &serde_json::to_string(&forged).unwrap())
        .unwrap();
    assert_eq!(view.lookup("a").unwrap().listen, forged.listen);
    let err = match c.connect_named("a") {
        Ok(_) => panic!("connected to b through a's forged record"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("reached agent \"b\""), "{err}");
    assert!(err.contains(&forged.instance), "{err}");
    assert!(kv_b.bytes().unwrap().iter().all(|&x| x == 0));
    drop((a, b));
}

/// Issue 54: the cluster was not part of an agent's identity. An etcd record of `a` in cluster
/// c1 rewritten to point at agent `a` of cluster c2 (same secret, its instance id copied from
/// etcd) was accepted, and writes went into c2's agent. The cluster is now in the identity
/// tag, and the caller asks for its own: refused, naming the cluster reached.
#[test]
fn a_record_pointing_at_a_namesake_of_another_cluster_is_refused() {
    let etcd = etcd();
    let url = etcd.url();
    let (a1, _kv1) = join_with_kv(&url, "c1", 30, 1 << 16);
    let (a2, kv2) = join_with_kv(&url, "c2", 30, 1 << 16);
    let c = join(&url, "c1", "client", 30);
    drop(c.connect_named("a").expect("the genuine record connects"));
    let v1 = gdx_cluster::ClusterView::connect(&gdx_cluster::EtcdOptions::new(&url), "c1").unwrap();
    let v2 = gdx_cluster::ClusterView::connect(&gdx_cluster::EtcdOptions::new(&url), "c2").unwrap();
    // c2's a, under c1's key: its address and instance, the same name.
    let forged = v2.lookup("a").unwrap();
    etcd.put("/gdx/c1/agents/a", &serde_json::to_string(&forged).unwrap())
        .unwrap();
    assert_eq!(v1.lookup("a").unwrap().instance, forged.instance);
    let err = match c.connect_named("a") {
        Ok(_) => panic!("connected to c2's a through c1's forged record"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("of cluster \"c2\""), "{err}");
    assert!(err.contains("of cluster \"c1\""), "{err}");
    assert!(kv2.bytes().unwrap().iter().all(|&x| x == 0));
    drop((a1, a2));
}
