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
