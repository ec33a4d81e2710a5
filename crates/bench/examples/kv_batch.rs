//! The batch of `examples/python/kv_transfer.py`, issued from Rust: the yardstick for the Python
//! binding's overhead (the Python example runs this binary with `--rust` and prints the ratio).
//!
//! ```text
//! cargo run --release -p gdx-bench --example kv_batch                 # 4 layers x 1,000 x 16 KiB
//! cargo run --release -p gdx-bench --example kv_batch -- --blocks 1000 --block 16384 \
//!     --layers 4 --iters 5 --warmup 1
//! ```
//!
//! A prefill process writes each layer's blocks (one batch of `--blocks` ops, with the
//! notification `layer-N`) from its 64 MiB pool (a caller-owned buffer: a numpy array there, a
//! `Vec` here) into a decode process's agent-allocated 64 MiB pool, at places given by block
//! tables. The decode process verifies every block after the last round. The last line is JSON:
//! median batch time, blocks/s, GB/s (1e9 B/s) and the path.
//!
//! Both processes share a secret through `GDX_SECRET_FILE`; without one, a temporary file is made.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

use gdx_base::clock::wall;
use gdx_engine::{Access, Agent, AgentConfig, Error, Secret, Transfer};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const POOL: usize = 64 << 20;
const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy)]
struct Shape {
    blocks: usize,
    block: usize,
    layers: usize,
    iters: usize,
    warmup: usize,
}

fn parse(args: &[String]) -> Result<Shape, Error> {
    let mut s = Shape {
        blocks: 1000,
        block: 16 << 10,
        layers: 4,
        iters: 5,
        warmup: 1,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it
            .next()
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or_else(|| Error::InvalidArgument(format!("{a} needs a number")))?;
        match a.as_str() {
            "--blocks" => s.blocks = v,
            "--block" => s.block = v,
            "--layers" => s.layers = v,
            "--iters" => s.iters = v,
            "--warmup" => s.warmup = v,
            other => return Err(Error::InvalidArgument(format!("unknown flag {other}"))),
        }
    }
    if s.blocks * s.layers * s.block > POOL || s.block == 0 || s.blocks == 0 {
        return Err(Error::InvalidArgument(
            "blocks x layers x block must fit the 64 MiB pool".into(),
        ));
    }
    Ok(s)
}

/// A small deterministic generator (splitmix64), so both processes derive the same tables and
/// bytes without sharing them.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Distinct pool block indices per layer (a shuffled pool, cut into layers).
fn tables(s: Shape, seed: u64) -> Vec<Vec<usize>> {
    let n = POOL / s.block;
    let mut perm: Vec<usize> = (0..n).collect();
    let mut r = Rng(seed);
    for i in (1..n).rev() {
        perm.swap(i, (r.next() % (i as u64 + 1)) as usize);
    }
    (0..s.layers)
        .map(|l| perm[l * s.blocks..(l + 1) * s.blocks].to_vec())
        .collect()
}

/// The bytes of block `j` of layer `l`.
fn fill(buf: &mut [u8], l: usize, j: usize) {
    let mut r = Rng(((l as u64) << 32) | j as u64);
    for c in buf.chunks_mut(8) {
        let v = r.next().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("decode") {
        return decode(parse(&args[1..])?);
    }
    prefill(parse(&args)?)
}

fn decode(s: Shape) -> Result<(), Error> {
    let agent = Agent::new(AgentConfig {
        name: "decode".into(),
        ..AgentConfig::from_env()?
    })?;
    let dst = tables(s, 1);
    let mut seen = vec![0usize; s.layers];
    // Agent-allocated (shared memory), as the Python example's decode pool: one copy per op.
    let region = agent.alloc(POOL as u64, Access::WRITE, Some("kv"))?;
    println!(
        "{}",
        agent
            .listen_addr()
            .ok_or_else(|| Error::unavailable(None, "not listening"))?
    );
    for _ in 0..s.layers * (s.iters + s.warmup) {
        let n = agent.wait_notification(WAIT)?;
        let l: usize = String::from_utf8_lossy(&n.data)
            .trim_start_matches("layer-")
            .parse()
            .map_err(|_| Error::Protocol("bad notification".into()))?;
        *seen
            .get_mut(l)
            .ok_or_else(|| Error::Protocol(format!("no layer {l}")))? += 1;
    }
    // Every round writes the same bytes, so the pool's final state shows every layer.
    let pool = region.bytes()?;
    let mut want = vec![0u8; s.block];
    let mut verified = 0;
    for (l, t) in dst.iter().enumerate() {
        if seen[l] != s.iters + s.warmup {
            return Err(Error::Protocol(format!(
                "layer {l}: {} notifications",
                seen[l]
            )));
        }
        for (j, &b) in t.iter().enumerate() {
            fill(&mut want, l, j);
            if pool[b * s.block..(b + 1) * s.block] != want[..] {
                return Err(Error::Protocol(format!("layer {l} block {j} differs")));
            }
            verified += 1;
        }
    }
    println!("verified {verified}");
    Ok(())
}

fn secret_file() -> Result<(String, Option<String>), Error> {
    if let Ok(p) = std::env::var("GDX_SECRET_FILE") {
        return Ok((p, None));
    }
    let path = std::env::temp_dir().join(format!("gdx-kv-batch-{}", std::process::id()));
    Secret::generate()?.write_file(&path)?;
    let p = path.display().to_string();
    Ok((p.clone(), Some(p)))
}

fn prefill(s: Shape) -> Result<(), Error> {
    let (secret, made) = secret_file()?;
    let exe = std::env::current_exe().map_err(|e| Error::os("current_exe", e))?;
    let shape = [
        ("--blocks", s.blocks),
        ("--block", s.block),
        ("--layers", s.layers),
        ("--iters", s.iters),
        ("--warmup", s.warmup),
    ];
    let mut child = Command::new(exe)
        .arg("decode")
        .args(
            shape
                .iter()
                .flat_map(|(k, v)| [k.to_string(), v.to_string()]),
        )
        .env("GDX_SECRET_FILE", &secret)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| Error::os("spawn", e))?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| Error::unavailable(None, "child stdout"))?;
    let mut lines = BufReader::new(out).lines();
    let mut next = || -> Result<String, Error> {
        lines
            .next()
            .ok_or_else(|| Error::peer_lost("decode process ended"))?
            .map_err(|e| Error::os("read", e))
    };
    let result = (|| -> Result<(), Error> {
        let addr = next()?;
        let agent = Agent::new(AgentConfig {
            name: "prefill".into(),
            secret: Some(Secret::from_file(std::path::Path::new(&secret))?),
            ..AgentConfig::from_env()?
        })?;
        let src_t = tables(s, 99);
        let dst_t = tables(s, 1);
        let mut pool = vec![0u8; POOL];
        for (l, t) in src_t.iter().enumerate() {
            for (j, &b) in t.iter().enumerate() {
                fill(&mut pool[b * s.block..(b + 1) * s.block], l, j);
            }
        }
        let peer = agent.connect(addr.as_str())?;
        let remote = peer.region("kv")?;
        let mut times = Vec::new();
        let mut plan = None;
        agent.scope(|scope| -> Result<(), Error> {
            let local = scope.register(&mut pool, Access::LOCAL, None)?;
            for it in 0..s.warmup + s.iters {
                for l in 0..s.layers {
                    // Building the batch is inside the timing, as in the Python example.
                    let (rep, dt) = wall(|| {
                        let mut t = Transfer::new();
                        for (&a, &b) in src_t[l].iter().zip(&dst_t[l]) {
                            let bs = s.block as u64;
                            t.write(&local, a as u64 * bs, &remote, b as u64 * bs, bs);
                        }
                        t.notify(format!("layer-{l}"));
                        peer.submit(t)?.wait(WAIT)
                    });
                    let rep = rep?;
                    let dt = dt.as_secs_f64();
                    plan.get_or_insert_with(|| rep.ops[0].plan.clone());
                    if it >= s.warmup {
                        times.push(dt);
                    }
                }
            }
            Ok(())
        })?;
        let verified = next()?;
        let med = gdx_base::stats::median(&times).unwrap_or(f64::NAN);
        let plan = plan.ok_or_else(|| Error::Protocol("no batch ran".into()))?;
        eprintln!(
            "rust: {:.0} blocks/s, {:.2} GB/s (median of {} batches of {} x {} B), path {}; decode {verified}",
            s.blocks as f64 / med,
            (s.blocks * s.block) as f64 / med / 1e9,
            times.len(),
            s.blocks,
            s.block,
            plan
        );
        println!(
            "{}",
            serde_json_line(&[
                ("side", "\"rust\"".into()),
                ("batch_s_median", format!("{med}")),
                ("blocks_per_s", format!("{}", s.blocks as f64 / med)),
                (
                    "gb_per_s",
                    format!("{}", (s.blocks * s.block) as f64 / med / 1e9)
                ),
                ("path", format!("{:?}", plan.path.to_string())),
                ("batches", format!("{}", times.len())),
            ])
        );
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    if let Some(p) = made {
        let _ = std::fs::remove_file(p);
    }
    result
}

/// One JSON object from already-encoded values (keeps serde_json out of the example's deps).
fn serde_json_line(kv: &[(&str, String)]) -> String {
    let body: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
    format!("{{{}}}", body.join(", "))
}
