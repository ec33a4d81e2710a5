//! Shared test helpers: a real etcd, agents with a shared secret, a child agent process, and
//! condition waits with generous deadlines (no timing assertions).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gdx_cluster::test_support::EtcdServer;
use gdx_cluster::{ClusterAgent, ClusterConfig, EtcdOptions, NamedPeer};
use gdx_engine::{Access, Agent, AgentConfig, Region, Secret, Transfer, TransferReport};

pub const SECRET: &[u8] = b"gdx-cluster-tests-shared-secret-0123";

pub fn etcd() -> EtcdServer {
    EtcdServer::start().unwrap_or_else(|e| {
        panic!("{e} (the cluster tests need a real etcd: apt-get install etcd-server)")
    })
}

pub fn agent_config(name: &str) -> AgentConfig {
    AgentConfig {
        name: name.to_string(),
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        secret: Some(Secret::from_bytes(SECRET).expect("secret")),
        // Lease expiry, not the I/O timeout, must be what ends a stalled peer in these tests.
        io_timeout: Duration::from_secs(120),
        transfer_timeout: Duration::from_secs(120),
        ..AgentConfig::default()
    }
}

pub fn cluster_config(url: &str, cluster: &str, ttl_s: i64) -> ClusterConfig {
    let mut c = ClusterConfig::new(EtcdOptions::new(url), cluster);
    c.ttl_s = ttl_s;
    c
}

pub fn join(url: &str, cluster: &str, name: &str, ttl_s: i64) -> ClusterAgent {
    let agent = Agent::new(agent_config(name)).expect("agent");
    ClusterAgent::join(agent, cluster_config(url, cluster, ttl_s)).expect("join")
}

/// Agent `a` joined to `cluster` publishing a `kv_len` read/write region `kv`.
pub fn join_with_kv(
    url: &str,
    cluster: &str,
    ttl_s: i64,
    kv_len: u64,
) -> (ClusterAgent, Region<'static>) {
    let agent = Agent::new(agent_config("a")).expect("agent");
    let kv = agent
        .alloc(kv_len, Access::READ_WRITE, Some("kv"))
        .expect("alloc");
    let a = ClusterAgent::join(agent, cluster_config(url, cluster, ttl_s)).expect("join");
    (a, kv)
}

/// A local region of `b` holding gdx-base's test pattern of `seed`, and that pattern.
pub fn filled_source(b: &ClusterAgent, len: usize, seed: u8) -> (Region<'static>, Vec<u8>) {
    let mut src = b
        .agent()
        .alloc(len as u64, Access::LOCAL, None)
        .expect("src");
    let data = gdx_base::pattern::pattern(len, u64::from(seed));
    src.bytes_mut().expect("bytes").copy_from_slice(&data);
    (src, data)
}

/// Submits `t` to `peer` and waits for it (60 s); panics naming `what` if it fails.
pub fn complete(peer: &NamedPeer, t: Transfer, what: &str) -> TransferReport {
    peer.submit(t)
        .expect("submit")
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// Waits until `f` holds, polling; panics with `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An agent in a child process (this test binary re-executed as role `agent`), so that it
/// can be stopped and killed with signals.
pub struct ChildAgent {
    pub child: Child,
    pub instance: String,
}

impl ChildAgent {
    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, sig).unwrap_or_else(|e| panic!("kill({sig:?}): {e}"));
    }
}

impl Drop for ChildAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn_child(test: &str, url: &str, cluster: &str, name: &str, ttl_s: i64) -> ChildAgent {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_CLUSTER_ROLE", "agent")
        .env("GDX_CLUSTER_URL", url)
        .env("GDX_CLUSTER_NAME", cluster)
        .env("GDX_CLUSTER_AGENT", name)
        .env("GDX_CLUSTER_TTL", ttl_s.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child agent");
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let instance = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(i) = l.split("GDX_CLUSTER_READY ").nth(1) {
                    break i.trim().to_string();
                }
            }
            other => panic!("child agent ended before it was ready: {other:?}"),
        }
    };
    ChildAgent { child, instance }
}

/// The child role's body: join, publish a 64 MiB read/write region `kv`, serve until stdin
/// closes or a signal ends the process.
pub fn child_role() {
    assert_eq!(
        std::env::var("GDX_CLUSTER_ROLE").as_deref(),
        Ok("agent"),
        "a role: run only as a child of the discovery tests"
    );
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}"));
    let agent = Agent::new(agent_config(&env("GDX_CLUSTER_AGENT"))).expect("agent");
    let _kv = agent
        .alloc(64 << 20, gdx_engine::Access::READ_WRITE, Some("kv"))
        .expect("alloc");
    let ttl: i64 = env("GDX_CLUSTER_TTL").parse().expect("ttl");
    let ca = ClusterAgent::join(
        agent,
        cluster_config(&env("GDX_CLUSTER_URL"), &env("GDX_CLUSTER_NAME"), ttl),
    )
    .expect("join");
    println!("GDX_CLUSTER_READY {}", ca.instance());
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
}
