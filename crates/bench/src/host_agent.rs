//! The agent cases (`host_to_host_shm`, `host_to_host_tcp`, the fabric cases, and their
//! `host_to_remote_*` forms): a transfer loop between this process and a loopback agent or a
//! `gdx serve`, rows judged against the latency floors measured between their blocks, and the
//! bytes verified after the timed loop.

use std::cell::RefCell;
use std::time::Duration;

use gdx_base::pattern::fill_pattern;
use gdx_engine::{
    Access, Agent, AgentConfig, Path, Peer, PreparedTransfer, Region, RegionDesc, Transfer,
    Transports,
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

/// Prepares the transfer of each of `positions` rotation positions once (`--prepared`); the
/// position that could not be, with the engine's error.
fn prepare_positions(
    peer: &Peer,
    positions: u64,
    build: impl Fn(u64) -> Transfer,
) -> Result<Vec<PreparedTransfer>, (u64, gdx_engine::Error)> {
    (0..positions)
        .map(|j| peer.prepare(build(j)).map_err(|e| (j, e)))
        .collect()
}

/// How a row was run, for its notes.
struct Shape {
    /// Warm-up transfers done before timing.
    warmed: u64,
    /// The warm-up asked for.
    warmup: u64,
    /// `--prepared`: (positions prepared, slots rotated over).
    prepared: Option<(u64, u64)>,
    /// Ops per transfer.
    batch: u64,
    /// Transfers in flight.
    inflight: u64,
    /// Both agents in this process.
    loopback: bool,
}

impl Shape {
    fn note(&self, row: &mut Row) {
        let (batch, inflight) = (self.batch, self.inflight);
        if self.warmed > self.warmup {
            row.add_note(format!(
                "timed after {} warm-up transfer(s) (small rows warm up as the floors do)",
                self.warmed
            ));
        }
        if let Some((positions, n)) = self.prepared {
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
        if self.loopback {
            row.add_note("cpu includes both agents (loopback, one process)");
        }
    }
}

/// Names each rail's bytes in a note when a row went over more than one.
fn note_rails(row: &mut Row) {
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
}

/// The first `len` bytes of `got` (`what`, for a mapping error) against those of `want` (the
/// source).
fn compare_regions(
    got: &Region<'_>,
    what: &'static str,
    want: &Region<'_>,
    len: u64,
) -> Result<Option<crate::error::Mismatch>, BenchError> {
    let got = got.bytes().map_err(BenchError::engine(what))?;
    let want = want
        .bytes()
        .map_err(BenchError::engine("mapping the source"))?;
    Ok(compare(&got[..len as usize], &want[..len as usize]))
}

/// How long one transfer may take before the row fails.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The references measured between a row's blocks of transfers: a latency row (one op at a
/// time) beside its floor (`NearFloor`), a batch row (one transfer of many ops) beside a
/// single-thread memcpy of the same bytes (`NearCopy`).
struct Beside {
    near: Option<FloorKind>,
    floors: Vec<Option<f64>>,
    /// Bytes per transfer.
    per: u64,
    copy: Option<CopyRef>,
    copies: Vec<Option<f64>>,
}

impl Beside {
    fn new(path: PathKind, size: u64, batch: u64, inflight: u64) -> Beside {
        let per = size * batch;
        Beside {
            near: FloorKind::of(path).filter(|_| batch * inflight == 1 && size <= NEAR_MAX),
            floors: Vec::new(),
            per,
            copy: (batch > 1
                && inflight == 1
                && (copyref::MIN_BYTES..=copyref::MAX_BYTES).contains(&per))
            .then(|| CopyRef::new(per as usize)),
            copies: Vec::new(),
        }
    }

    /// Before transfer `i`: a reference block every [`BLOCK_OPS`] transfers; the CPU time it
    /// took, which the timing leaves out.
    fn block(&mut self, i: u64) -> Duration {
        if !i.is_multiple_of(BLOCK_OPS) {
            return Duration::ZERO;
        }
        let cpu = gdx_sys::os::process_cpu_time().ok();
        match (self.near, self.copy.as_mut()) {
            (Some(k), _) => self.floors.push(k.block()),
            (None, Some(c)) => self.copies.push(c.block()),
            (None, None) => return Duration::ZERO,
        }
        match (cpu, gdx_sys::os::process_cpu_time().ok()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => Duration::ZERO,
        }
    }

    /// Pairs the blocks with the row's samples (nothing was measured: no pairing).
    fn pair(&self, row: &mut Row, samples: &[Duration]) {
        row.floor_near = NearFloor::pair(&self.floors, samples);
        row.copy_near = copyref::pair(self.per, &self.copies, samples);
    }
}

/// What a connected case's sizes share.
#[derive(Clone, Copy)]
struct Conn<'a> {
    peer: &'a Peer,
    remote: &'a RegionDesc,
    loopback: Option<&'a Loopback>,
    scratch: Option<&'a Region<'a>>,
    /// Bytes of the remote region the rotation uses.
    window: u64,
}

/// The loopback target: an agent in this process serving one region.
struct Loopback {
    region: Region<'static>,
    agent: Agent,
}

impl AgentCase {
    /// Whether the engine moved a transfer over this case's path (or its shm fallbacks).
    fn check(&self, rep: gdx_engine::TransferReport) -> Result<(), BenchError> {
        match rep.ops.first().map(|o| o.plan.path) {
            Some(p)
                if p != self.want()
                    && !(matches!(p, Path::ShmStaged | Path::Cma) && self.want() == Path::Shm) =>
            {
                Err(BenchError::WrongPath {
                    context: "the engine moved the transfer".into(),
                    took: p,
                    want: self.want(),
                })
            }
            _ => Ok(()),
        }
    }

    /// The first `len` bytes the peer holds against `local`'s: the loopback region itself, or
    /// read back into the scratch buffer.
    fn verify(
        &self,
        conn: &Conn<'_>,
        local: &Region<'_>,
        len: u64,
    ) -> Result<Option<crate::error::Mismatch>, BenchError> {
        match (conn.loopback, conn.scratch) {
            (Some(l), _) => compare_regions(&l.region, "mapping the loopback region", local, len),
            (None, Some(s)) => {
                let mut t = Transfer::new();
                t.read(s, 0, conn.remote, 0, len);
                let rep = conn
                    .peer
                    .submit(t)
                    .and_then(|h| h.wait(TIMEOUT))
                    .map_err(BenchError::engine("transfer"))?;
                self.check(rep)?;
                compare_regions(s, "mapping the read-back buffer", local, len)
            }
            (None, None) => Ok(None),
        }
    }

    /// One size of [`BenchCase::run`]: its row, measured or failed.
    fn run_size(
        &self,
        conn: &Conn<'_>,
        local: &mut Region<'_>,
        params: &Params,
        size: u64,
    ) -> Result<Row, BenchError> {
        let Conn {
            peer,
            remote,
            loopback: lb,
            window,
            ..
        } = *conn;
        let batch = u64::from(params.batch.max(1));
        let inflight = u64::from(params.window.max(1));
        let check = |rep| self.check(rep);
        if size > window {
            return Ok(Row::failed(
                &self.spec,
                size,
                format!("the peer's region is {window} bytes (start `gdx serve --size` larger)"),
            ));
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
                t.write(local, off, remote, off, size);
            }
            t
        };
        let positions = (n / batch).max(1);
        let mut prepared = Vec::new();
        if params.prepared {
            match prepare_positions(peer, positions, |j| build(local, j)) {
                Ok(p) => prepared = p,
                Err((j, e)) => {
                    let why = format!("preparing transfer {j}: {e}");
                    return Ok(Row::failed(&self.spec, size, why));
                }
            }
        }
        let rails_before = peer.rails();
        let cell = RefCell::new(&mut *local);
        let mut beside = Beside::new(self.spec.path, size, batch, inflight);
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
                    return check(h.wait(TIMEOUT).map_err(BenchError::engine("transfer"))?);
                }
                let mut hs = Vec::with_capacity(inflight as usize);
                for w in 0..inflight {
                    hs.push(transfer(w)?);
                }
                for h in hs {
                    check(h.wait(TIMEOUT).map_err(BenchError::engine("transfer"))?)?;
                }
                Ok(())
            },
            |i| beside.block(i),
        );
        let timed = match timed {
            Ok(t) => t,
            Err(e) => return Ok(Row::failed(&self.spec, size, e.chain())),
        };
        let mut row = Row::new(&self.spec, size);
        fill_wall_row(&mut row, (size * batch * inflight) as f64, &timed);
        beside.pair(&mut row, &timed.samples);
        let shape = Shape {
            warmed: timed.warmed,
            warmup: u64::from(params.warmup.max(1)),
            prepared: params.prepared.then_some((positions, n)),
            batch,
            inflight,
            loopback: lb.is_some(),
        };
        shape.note(&mut row);
        row.cpu_s_per_gb = timed.cpu_s_per_gb;
        row.rails = rail_rows(&rails_before, &peer.rails());
        note_rails(&mut row);
        if params.verify {
            let bad = self.verify(conn, local, n.min(total.max(1)) * size)?;
            row.verified = Some(bad.is_none());
            if let Some(b) = bad {
                row.add_note(b.to_string());
            }
        }
        Ok(row)
    }

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
        let conn = Conn {
            peer: &peer,
            remote: &remote,
            loopback: lb.as_ref(),
            scratch: scratch.as_ref(),
            window,
        };
        for &size in &params.sizes {
            sink(self.run_size(&conn, &mut local, params, size)?);
        }
        drop(peer);
        if let Some(l) = lb {
            drop(l.region);
            drop(l.agent);
        }
        Ok(())
    }
}
