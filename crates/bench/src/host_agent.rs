//! The agent cases (`host_to_host_shm`, `host_to_host_tcp`, the fabric cases, and their
//! `host_to_remote_*` forms): a transfer loop between this process and a loopback agent or a
//! `gdx serve`, rows judged against the latency floors measured between their blocks, and the
//! bytes verified after the timed loop.

use std::cell::RefCell;
use std::time::Duration;

use gdx_base::pattern::fill_pattern;
use gdx_engine::{
    Access, Agent, AgentConfig, Path, Peer, Region, RegionDesc, Transfer, Transports,
};

use super::{
    compare, fill_wall_row, prepared_slots, seed_for, slots, wall_loop_between, Warmup, NEAR_MAX,
    PREPARED_NOTE, WINDOW_NOTE,
};
use crate::case::{BenchCase, CaseSpec, Params, PathKind, Waived, ROTATE_BYTES};
use crate::copyref::{self, CopyRef};
use crate::error::BenchError;
use crate::floors::{FloorKind, NearFloor, BLOCK_OPS};
use crate::report::Row;
use crate::Ctx;

/// shm, tcp, fabric or rdma between two agents (the engine's transports; the raw verbs cases
/// are in [`crate::rdma`]).
pub(crate) struct AgentCase {
    pub(crate) spec: CaseSpec,
    pub(crate) peer: Option<String>,
    pub(crate) region: String,
    /// The libfabric provider of a fabric case (`None`: `GDX_FABRIC_PROVIDER` or automatic).
    pub(crate) provider: Option<String>,
}

/// The rails of a row: the bytes moved over each between `before` and `after` (snapshots of
/// the peer's rails), with each rail's state after.
fn rail_rows(
    before: &[gdx_engine::RailInfo],
    after: &[gdx_engine::RailInfo],
) -> Vec<crate::report::RailRow> {
    after
        .iter()
        .enumerate()
        .map(|(i, r)| crate::report::RailRow {
            local: r.local.clone(),
            remote: r.remote.clone(),
            bytes: r.bytes.saturating_sub(before.get(i).map_or(0, |b| b.bytes)),
            state: r.state.as_str().to_string(),
            cause: r.cause.clone(),
        })
        .collect()
}

/// The loopback target: an agent in this process serving one region.
struct Loopback {
    region: Region<'static>,
    agent: Agent,
}

impl AgentCase {
    fn want(&self) -> Path {
        match self.spec.path {
            PathKind::Shm => Path::Shm,
            PathKind::Fabric => Path::Fabric,
            PathKind::Rdma => Path::Rdma,
            _ => Path::Tcp,
        }
    }

    fn connect(
        &self,
        window: u64,
        nics: &[String],
        expect: Option<&gdx_engine::Expected>,
    ) -> Result<(Agent, Peer, RegionDesc, Option<Loopback>), BenchError> {
        let mut base = AgentConfig::from_env().map_err(BenchError::engine("GDX_* settings"))?;
        if !nics.is_empty() {
            base.nics = nics.to_vec();
        }
        let shm = self.spec.path == PathKind::Shm;
        let fabric = self.spec.path == PathKind::Fabric;
        let rdma = self.spec.path == PathKind::Rdma;
        let client_cfg = AgentConfig {
            name: format!("gdx-bench-{}", std::process::id()),
            // Each case measures its own path: rdma stays off in the others even where a NIC
            // exists.
            transports: Transports {
                tcp: true,
                shm,
                rdma,
                fabric,
            },
            fabric_provider: self.provider.clone(),
            ..base.clone()
        };
        let client =
            Agent::new(client_cfg).map_err(BenchError::engine("starting the client agent"))?;
        let (addr, lb) = match &self.peer {
            Some(a) => (a.clone(), None),
            None => {
                let server = Agent::new(AgentConfig {
                    name: format!("gdx-bench-target-{}", std::process::id()),
                    listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
                    transports: Transports {
                        tcp: true,
                        shm: true,
                        rdma,
                        fabric,
                    },
                    fabric_provider: self.provider.clone(),
                    ..base
                })
                .map_err(BenchError::engine("starting the loopback agent"))?;
                let region = server
                    .alloc(window, Access::READ_WRITE, Some(&self.region))
                    .map_err(BenchError::engine(format!(
                        "allocating {window} bytes on the loopback agent"
                    )))?;
                let addr = server
                    .listen_addr()
                    .ok_or_else(|| {
                        BenchError::Unmeasurable("the loopback agent has no address".into())
                    })?
                    .to_string();
                (
                    addr,
                    Some(Loopback {
                        region,
                        agent: server,
                    }),
                )
            }
        };
        let peer = match (expect, lb.is_none()) {
            (Some(e), true) => client.connect_expecting(addr.as_str(), e),
            _ => client.connect(addr.as_str()),
        }
        .map_err(BenchError::engine(format!("connecting to {addr}")))?;
        let route = peer.route();
        if route.transport != self.want() {
            return Err(BenchError::WrongPath {
                context: format!("the peer at {addr} is reached ({})", route.reason),
                took: route.transport,
                want: self.want(),
            });
        }
        let desc = peer
            .region(&self.region)
            .map_err(BenchError::engine(format!(
                "looking up region {:?} on {addr}",
                self.region
            )))?;
        Ok((client, peer, desc, lb))
    }
}

impl BenchCase for AgentCase {
    fn spec(&self) -> &CaseSpec {
        &self.spec
    }

    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived> {
        if self.spec.path != PathKind::Rdma {
            return Ok(());
        }
        ctx.require_rdma()?;
        // `--peer` alone names the raw rdma cases' server (`gdx serve --rdma-listen`), which is
        // not an agent: this case needs the agent's address given apart from it.
        match (&ctx.peer, &ctx.rdma_peer) {
            (Some((agent, _)), Some(rdma)) if agent == rdma => Err(Waived::new(
                "the engine's rdma case needs the gdx serve agent's address apart from the rdma                  bench server's: give --peer AGENT:PORT and --rdma-peer HOST:PORT",
            )),
            _ => Ok(()),
        }
    }

    /// The rdma case is opt-in, as the raw rdma cases are (`--path rdma`).
    fn opt_in(&self) -> bool {
        self.spec.path == PathKind::Rdma
    }

    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError> {
        let batch = u64::from(params.batch.max(1));
        let inflight = u64::from(params.window.max(1));
        let want = params
            .max_size()
            .saturating_mul(batch * inflight)
            .max(ROTATE_BYTES.min(params.max_size().max(1) * 64))
            .min(ROTATE_BYTES.max(params.max_size()));
        let (client, peer, remote, lb) = self.connect(want, &ctx.nics, ctx.peer_expect.as_ref())?;
        let window = remote.len.min(want);
        let mut local = client
            .alloc(window, Access::LOCAL, None)
            .map_err(BenchError::engine(format!("allocating {window} bytes")))?;
        let scratch = if params.verify && lb.is_none() {
            Some(
                client
                    .alloc(window, Access::LOCAL, None)
                    .map_err(BenchError::engine("allocating the read-back buffer"))?,
            )
        } else {
            None
        };
        let timeout = Duration::from_secs(120);
        let check = |rep: gdx_engine::TransferReport| -> Result<(), BenchError> {
            match rep.ops.first().map(|o| o.plan.path) {
                Some(p)
                    if p != self.want()
                        && !(matches!(p, Path::ShmStaged | Path::Cma)
                            && self.want() == Path::Shm) =>
                {
                    Err(BenchError::WrongPath {
                        context: "the engine moved the transfer".into(),
                        took: p,
                        want: self.want(),
                    })
                }
                _ => Ok(()),
            }
        };
        let xfer = |t: Transfer| -> Result<(), BenchError> {
            check(
                peer.submit(t)
                    .and_then(|h| h.wait(timeout))
                    .map_err(BenchError::engine("transfer"))?,
            )
        };
        for &size in &params.sizes {
            if size > window {
                sink(Row::failed(
                    &self.spec,
                    size,
                    format!(
                        "the peer's region is {window} bytes (start `gdx serve --size` larger)"
                    ),
                ));
                continue;
            }
            let n = slots(size, window);
            let seed = seed_for(size);
            {
                let mut b = local
                    .bytes_mut()
                    .map_err(BenchError::engine("mapping the source"))?;
                fill_pattern(&mut b[..size as usize], seed);
            }
            let mut total = 0;
            // `--prepared`: each rotation position's transfer is prepared once and posted again
            // (over fewer positions: see `prepared_slots`).
            let n = if params.prepared {
                prepared_slots(n, batch)
            } else {
                n
            };
            // Transfer `j` of the rotation: ops `j * batch ..` of the slots, wrapping.
            let build = |local: &Region<'_>, j: u64| {
                let mut t = Transfer::with_capacity(batch as usize);
                for k in 0..batch {
                    let off = ((j * batch + k) % n) * size;
                    t.write(local, off, &remote, off, size);
                }
                t
            };
            let positions = (n / batch).max(1);
            let mut prepared = Vec::new();
            if params.prepared {
                for j in 0..positions {
                    match peer.prepare(build(&local, j)) {
                        Ok(p) => prepared.push(p),
                        Err(e) => {
                            sink(Row::failed(
                                &self.spec,
                                size,
                                format!("preparing transfer {j}: {e}"),
                            ));
                            break;
                        }
                    }
                }
                if prepared.len() as u64 != positions {
                    continue;
                }
            }
            let rails_before = peer.rails();
            let cell = RefCell::new(&mut local);
            // A latency row (one op at a time) is judged against its floor measured between
            // its blocks of transfers (`NearFloor`).
            let near =
                FloorKind::of(self.spec.path).filter(|_| batch * inflight == 1 && size <= NEAR_MAX);
            let mut floors = Vec::new();
            // A batch row (one transfer of many ops at a time) is judged against a
            // single-thread memcpy of the same bytes measured between its blocks (`NearCopy`).
            let per = size * batch;
            let mut copy = (batch > 1
                && inflight == 1
                && (copyref::MIN_BYTES..=copyref::MAX_BYTES).contains(&per))
            .then(|| CopyRef::new(per as usize));
            let mut copies = Vec::new();
            // Small rows (a floor beside them, or a message rate) are timed warm.
            let warm = if size <= NEAR_MAX {
                Warmup::SMALL_HOST
            } else {
                Warmup::NONE
            };
            let timed = wall_loop_between(
                params,
                (size * batch * inflight) as f64,
                warm,
                |t| {
                    total = t * batch * inflight;
                    let tb = (n.min(total.max(1)) * size) as usize;
                    let mut l = cell.borrow_mut();
                    let mut b = l
                        .bytes_mut()
                        .map_err(BenchError::engine("mapping the source"))?;
                    fill_pattern(&mut b[..tb], seed);
                    Ok(())
                },
                |i| {
                    // `inflight` transfers of `batch` ops each, all submitted before any wait.
                    let mut transfer = |w: u64| {
                        let j = i * inflight + w;
                        let r = if prepared.is_empty() {
                            peer.submit(build(&cell.borrow(), j))
                        } else {
                            prepared[(j % positions) as usize].post()
                        };
                        r.map_err(BenchError::engine("transfer"))
                    };
                    if inflight == 1 {
                        // One at a time (the latency rows): no list of handles to allocate in
                        // the timed loop, which is the engine's figure, not the harness's.
                        let h = transfer(0)?;
                        return check(h.wait(timeout).map_err(BenchError::engine("transfer"))?);
                    }
                    let mut hs = Vec::with_capacity(inflight as usize);
                    for w in 0..inflight {
                        hs.push(transfer(w)?);
                    }
                    for h in hs {
                        check(h.wait(timeout).map_err(BenchError::engine("transfer"))?)?;
                    }
                    Ok(())
                },
                |i| {
                    if !i.is_multiple_of(BLOCK_OPS) {
                        return Duration::ZERO;
                    }
                    let cpu = gdx_sys::os::process_cpu_time().ok();
                    match (near, copy.as_mut()) {
                        (Some(k), _) => floors.push(k.block()),
                        (None, Some(c)) => copies.push(c.block()),
                        (None, None) => return Duration::ZERO,
                    }
                    match (cpu, gdx_sys::os::process_cpu_time().ok()) {
                        (Some(a), Some(b)) => b.saturating_sub(a),
                        _ => Duration::ZERO,
                    }
                },
            );
            let timed = match timed {
                Ok(t) => t,
                Err(e) => {
                    sink(Row::failed(&self.spec, size, e.chain()));
                    continue;
                }
            };
            let mut row = Row::new(&self.spec, size);
            fill_wall_row(&mut row, (size * batch * inflight) as f64, &timed);
            row.floor_near = NearFloor::pair(&floors, &timed.samples);
            // No copy was measured (not a batch row): `copies` is empty, and so is the pairing.
            row.copy_near = copyref::pair(per, &copies, &timed.samples);
            if timed.warmed > u64::from(params.warmup.max(1)) {
                row.add_note(format!(
                    "timed after {} warm-up transfer(s) (small rows warm up as the floors do)",
                    timed.warmed
                ));
            }
            if params.prepared {
                row.add_note(format!(
                    "{PREPARED_NOTE}: {positions} transfer(s) prepared once (validated, planned) \
                     and posted again in turn, over {n} slot(s)"
                ));
            }
            if batch * inflight > 1 {
                // Bandwidth counts every op's bytes, so the message rate derived from it
                // (bandwidth / size, `finish_row`) counts ops.
                row.add_note(format!(
                    "{inflight} transfer(s) in flight of {batch} op(s) each; p50/p99 are per \
                     {WINDOW_NOTE}, Mop/s per op"
                ));
            }
            row.cpu_s_per_gb = timed.cpu_s_per_gb;
            row.rails = rail_rows(&rails_before, &peer.rails());
            if row.rails.len() > 1 {
                let each: Vec<String> = row
                    .rails
                    .iter()
                    .map(|r| match &r.cause {
                        Some(c) => format!("{} {} B, {} ({c})", r.local, r.bytes, r.state),
                        None => format!("{} {} B", r.local, r.bytes),
                    })
                    .collect();
                row.add_note(format!("rails: {}", each.join(", ")));
            }
            if lb.is_some() {
                row.add_note("cpu includes both agents (loopback, one process)");
            }
            if params.verify {
                let tb = n.min(total.max(1)) * size;
                let want = local
                    .bytes()
                    .map_err(BenchError::engine("mapping the source"))?;
                let bad = match (&lb, &scratch) {
                    (Some(l), _) => {
                        let got = l
                            .region
                            .bytes()
                            .map_err(BenchError::engine("mapping the loopback region"))?;
                        compare(&got[..tb as usize], &want[..tb as usize])
                    }
                    (None, Some(s)) => {
                        let mut t = Transfer::new();
                        t.read(s, 0, &remote, 0, tb);
                        xfer(t)?;
                        let got = s
                            .bytes()
                            .map_err(BenchError::engine("mapping the read-back buffer"))?;
                        compare(&got[..tb as usize], &want[..tb as usize])
                    }
                    (None, None) => None,
                };
                row.verified = Some(bad.is_none());
                if let Some(b) = bad {
                    row.add_note(b.to_string());
                }
            }
            sink(row);
        }
        drop(peer);
        if let Some(l) = lb {
            drop(l.region);
            drop(l.agent);
        }
        Ok(())
    }
}
