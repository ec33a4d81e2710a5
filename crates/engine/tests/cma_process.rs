//! The `cma` path between two processes: this test binary re-executes itself
//! (`GDX_TEST_ROLE=cma-target`) as a target that registers a buffer of its own (borrowed, no
//! memfd) and prints its address. The initiator writes and reads scattered blocks of it with one
//! kernel copy between the processes; and where the kernel forbids that (a target that is not
//! dumpable, reached by a thread without `CAP_SYS_PTRACE`: `EPERM`), the plan stages and its
//! reason says so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_base::pattern::permutation;
use gdx_engine::{Access, Agent, AgentConfig, Path, Transfer};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

const BLOCK: usize = 16 << 10;
const POOL_BLOCKS: usize = 2_048;
const TARGET_SEED: u64 = 21;

/// The target role: a borrowed pool filled with `pattern(TARGET_SEED)`, served until stdin
/// closes. `GDX_TEST_NODUMP=1`: the process makes itself not dumpable first.
#[test]
#[ignore = "a role: run as a child process by the tests of this file"]
fn role_cma_target() {
    assert_eq!(
        std::env::var("GDX_TEST_ROLE").as_deref(),
        Ok("cma-target"),
        "a role: run only as a child of the tests of this file"
    );
    if std::env::var("GDX_TEST_NODUMP").as_deref() == Ok("1") {
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .unwrap();
    }
    let mut cfg = AgentConfig::from_env().unwrap();
    cfg.name = "cma-target".into();
    let agent = Agent::new(cfg).unwrap();
    let mut pool = pattern(POOL_BLOCKS * BLOCK, TARGET_SEED);
    // SAFETY: `pool` outlives the region (dropped below, before it) and is touched only
    // through the region meanwhile.
    let r = unsafe {
        agent.register_raw(
            pool.as_mut_ptr(),
            pool.len() as u64,
            Access::READ_WRITE,
            Some("pool"),
        )
    }
    .unwrap();
    println!(
        "GDX_CMA_TARGET addr={} pid={}",
        agent.listen_addr().unwrap(),
        std::process::id()
    );
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(r);
    drop(pool);
}

struct Target {
    child: Child,
    addr: String,
    pid: u32,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_target(nodump: bool) -> Target {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "role_cma_target",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_TEST_ROLE", "cma-target")
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_TEST_NODUMP", if nodump { "1" } else { "0" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let line = BufReader::new(out)
        .lines()
        .map_while(|l| l.ok())
        .find_map(|l| l.find("GDX_CMA_TARGET ").map(|i| l[i..].to_string()))
        .expect("the target printed its address");
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    Target {
        addr: field("addr="),
        pid: field("pid=").parse().unwrap(),
        child,
    }
}

/// Writes 1,000 scattered blocks into the target's pool, reads the whole pool back (every op
/// on `want`), and checks the written blocks and the untouched ones.
fn write_and_check(target: &Target, want: Path) -> String {
    let init = agent("init", true);
    let peer = init.connect(target.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm, "{:?}", peer.route());
    let remote = peer.region("pool").unwrap();
    assert!(!remote.shareable);
    let len = POOL_BLOCKS * BLOCK;
    let mut src = init.alloc(len as u64, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 22);
    let pairs: Vec<(usize, usize)> = permutation(POOL_BLOCKS, 1)
        .into_iter()
        .zip(permutation(POOL_BLOCKS, 2))
        .take(1_000)
        .collect();
    let mut t = Transfer::new();
    for &(s, d) in &pairs {
        t.write(
            &src,
            (s * BLOCK) as u64,
            &remote,
            (d * BLOCK) as u64,
            BLOCK as u64,
        );
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    let plan = rep.ops[0].plan.clone();
    assert!(rep.ops.iter().all(|o| o.plan.path == want), "{plan}");

    // The whole pool back, as 2,048 block reads (the same path).
    let back = init.alloc(len as u64, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    for b in 0..POOL_BLOCKS {
        let at = (b * BLOCK) as u64;
        t.read(&back, at, &remote, at, BLOCK as u64);
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert!(rep.ops.iter().all(|o| o.plan.path == want));
    let mut expect = pattern(len, TARGET_SEED);
    let s = src.bytes().unwrap();
    for &(sb, db) in &pairs {
        expect[db * BLOCK..(db + 1) * BLOCK].copy_from_slice(&s[sb * BLOCK..(sb + 1) * BLOCK]);
    }
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &expect),
        None,
        "the pool read back differs (written or untouched blocks)"
    );
    plan.reason.to_string()
}

#[test]
fn cma_moves_scattered_blocks_between_two_processes() {
    let target = spawn_target(false);
    let why = write_and_check(&target, Path::Cma);
    assert!(why.contains(&format!("pid {}", target.pid)), "{why}");
    assert!(why.contains("process_vm_writev"), "{why}");
}

#[test]
fn a_target_the_kernel_keeps_out_stages_and_names_eperm() {
    // Not dumpable: only a process with CAP_SYS_PTRACE may reach it. This thread (and the
    // threads it starts: the agent's) gives that capability up, as an unprivileged user has it.
    let target = spawn_target(true);
    let mut caps = rustix::thread::capabilities(None).unwrap();
    caps.effective
        .remove(rustix::thread::CapabilitySet::SYS_PTRACE);
    rustix::thread::set_capabilities(None, caps).unwrap();
    let why = write_and_check(&target, Path::ShmStaged);
    assert!(why.contains("EPERM"), "{why}");
    assert!(why.contains(&format!("pid {}", target.pid)), "{why}");
    assert!(why.contains("not dumpable"), "{why}");
}
