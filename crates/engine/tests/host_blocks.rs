//! Block lists over the host transports: one transfer of many ops between blocks of two pools
//! (paged KV caches offloaded to host memory), over tcp, over shm into agent-allocated memory
//! (`shm`), and over shm into a caller's borrowed buffer (`cma`, or `shm-staged` when the target
//! declines direct copies): 1 to 100,000 ops, scattered, reversed and adjacent, written and
//! read; every destination block is checked and every other block checked untouched. The
//! `cma` path between two processes, and the kernel refusing it, are in `cma_process.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_base::pattern::permutation;
use gdx_engine::{Access, Agent, Path, Region, Transfer};

/// Where the target's pool lives and which path its ops must take.
#[derive(Clone, Copy, Debug)]
struct Route {
    shm: bool,
    /// The pool is a caller's buffer (`register_raw`), not agent-allocated.
    borrowed: bool,
    /// The target grants direct copies (`AgentConfig::shm_cma`).
    cma: bool,
    want: Path,
}

const TCP: Route = Route {
    shm: false,
    borrowed: false,
    cma: true,
    want: Path::Tcp,
};
const SHM: Route = Route {
    shm: true,
    borrowed: false,
    cma: true,
    want: Path::Shm,
};
const CMA: Route = Route {
    shm: true,
    borrowed: true,
    cma: true,
    want: Path::Cma,
};
const STAGED: Route = Route {
    shm: true,
    borrowed: true,
    cma: false,
    want: Path::ShmStaged,
};

/// The target's pool: agent-allocated, or a buffer of ours registered in place.
struct Pool {
    region: Option<Region<'static>>,
    _buf: Vec<u8>,
}

impl Pool {
    fn new(agent: &Agent, len: usize, borrowed: bool, seed: u64) -> Pool {
        if !borrowed {
            let mut r = agent
                .alloc(len as u64, Access::READ_WRITE, Some("pool"))
                .unwrap();
            fill_pattern(&mut r.bytes_mut().unwrap(), seed);
            return Pool {
                region: Some(r),
                _buf: Vec::new(),
            };
        }
        let mut buf = pattern(len, seed);
        // SAFETY: `buf` outlives the region (dropped after it, `Drop` below) and is touched
        // only through the region meanwhile.
        let r = unsafe {
            agent.register_raw(
                buf.as_mut_ptr(),
                len as u64,
                Access::READ_WRITE,
                Some("pool"),
            )
        }
        .unwrap();
        Pool {
            region: Some(r),
            _buf: buf,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.region.as_ref().unwrap().bytes().unwrap().to_vec()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The region retires (waits for running leases) before the buffer goes.
        self.region.take();
    }
}

/// Moves block `src` to block `dst` for every pair, as one transfer, and checks every block of
/// the destination pool: written ones hold their source block, the rest their old bytes.
/// `write`: from the initiator's pool into the target's; else read the other way.
fn blocks(route: Route, pool_blocks: usize, block: usize, pairs: &[(usize, usize)], write: bool) {
    let mut tcfg = config("target", true);
    tcfg.shm_cma = route.cma;
    let target = Agent::new(tcfg).unwrap();
    let init = agent("init", route.shm);
    let len = pool_blocks * block;
    let remote_pool = Pool::new(&target, len, route.borrowed, 1);
    let mut local = init.alloc(len as u64, Access::LOCAL, None).unwrap();
    fill_pattern(&mut local.bytes_mut().unwrap(), 2);
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("pool").unwrap();
    assert_eq!(remote.shareable, !route.borrowed);

    let mut t = Transfer::new();
    for &(s, d) in pairs {
        let (s, d, n) = ((s * block) as u64, (d * block) as u64, block as u64);
        if write {
            t.write(&local, s, &remote, d, n);
        } else {
            t.read(&local, d, &remote, s, n);
        }
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops.len(), pairs.len());
    for o in &rep.ops {
        assert_eq!(o.plan.path, route.want, "{}", o.plan);
    }
    if route.want == Path::ShmStaged {
        assert!(
            rep.ops[0].plan.reason.contains("GDX_SHM_CMA"),
            "{}",
            rep.ops[0].plan
        );
    }

    let (src, before, after) = if write {
        (
            local.bytes().unwrap().to_vec(),
            pattern(len, 1),
            remote_pool.bytes(),
        )
    } else {
        (
            pattern(len, 1),
            pattern(len, 2),
            local.bytes().unwrap().to_vec(),
        )
    };
    let mut written = vec![false; pool_blocks];
    for &(s, d) in pairs {
        written[d] = true;
        assert!(
            after[d * block..(d + 1) * block] == src[s * block..(s + 1) * block],
            "{route:?}: block {d} does not hold block {s}"
        );
    }
    for (b, w) in written.iter().enumerate() {
        if !w {
            assert!(
                after[b * block..(b + 1) * block] == before[b * block..(b + 1) * block],
                "{route:?}: untouched block {b} changed"
            );
        }
    }
}

/// 1,000 pairs: sources and destinations each a fixed random choice from the pool.
fn scattered(pool: usize, n: usize) -> Vec<(usize, usize)> {
    let (s, d) = (permutation(pool, 11), permutation(pool, 12));
    s.into_iter().zip(d).take(n).collect()
}

fn reversed(n: usize) -> Vec<(usize, usize)> {
    (0..n).map(|i| (i, n - 1 - i)).collect()
}

/// Runs of 8 adjacent blocks to runs of 8 adjacent blocks elsewhere.
fn adjacent(runs: usize) -> Vec<(usize, usize)> {
    (0..runs)
        .flat_map(|r| (0..8).map(move |k| (r * 16 + k, 1_000 + r * 24 + k)))
        .collect()
}

const KIB16: usize = 16 << 10;

#[test]
fn one_block_each_way_on_every_route() {
    for route in [TCP, SHM, CMA, STAGED] {
        for write in [true, false] {
            blocks(route, 64, KIB16, &[(3, 40)], write);
        }
    }
}

#[test]
fn a_thousand_scattered_16k_blocks_on_every_route() {
    for route in [TCP, SHM, CMA, STAGED] {
        blocks(route, 2_048, KIB16, &scattered(2_048, 1_000), true);
        blocks(route, 2_048, KIB16, &scattered(2_048, 1_000), false);
    }
}

#[test]
fn reversed_and_adjacent_blocks_on_every_route() {
    for route in [TCP, SHM, CMA, STAGED] {
        blocks(route, 2_048, KIB16, &reversed(1_000), true);
        blocks(route, 2_048, KIB16, &adjacent(40), false);
    }
}

#[test]
fn a_hundred_thousand_small_blocks_on_every_route() {
    // 100,000 ops of 256 B out of a pool of 131,072 blocks (32 MiB) per side.
    for route in [TCP, SHM, CMA, STAGED] {
        blocks(route, 131_072, 256, &scattered(131_072, 100_000), true);
    }
}
