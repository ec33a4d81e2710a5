//! Helpers shared by the integration tests.
#![allow(dead_code)]

use gdx_engine::{Agent, AgentConfig, Transports};
use std::time::Duration;

/// Deterministic pseudo-random bytes (xorshift64*), seeded.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    for b in chunks.into_remainder() {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *b = x as u8;
    }
}

pub fn random_vec(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_random(&mut v, seed);
    v
}

pub fn config(name: &str, shm: bool) -> AgentConfig {
    AgentConfig {
        name: name.into(),
        transports: Transports {
            tcp: true,
            shm,
            rdma: true,
        },
        io_timeout: Duration::from_secs(20),
        ..AgentConfig::default()
    }
}

pub fn agent(name: &str, shm: bool) -> Agent {
    Agent::new(config(name, shm)).expect("agent")
}

pub const WAIT: Duration = Duration::from_secs(120);

/// Fast "random" fill for large buffers: a 1 MiB random block, each MiB stamped with its index and
/// the seed so blocks differ.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let block = random_vec(1 << 20, seed);
    for (i, c) in buf.chunks_mut(1 << 20).enumerate() {
        c.copy_from_slice(&block[..c.len()]);
        let stamp = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        let n = c.len().min(8);
        c[..n].copy_from_slice(&stamp.to_le_bytes()[..n]);
    }
}

/// Position of the first differing byte, for readable assertion messages on huge buffers.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}
