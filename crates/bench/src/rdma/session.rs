//! Both sides of an rdma bench run over a [`Control`] channel: [`run_client`] (the case's
//! side: sets up a [`Link`], times batches of operations per size, verifies) and [`serve`]
//! (the other side: allocates, registers and advertises the buffer the client writes into or
//! reads from, answers the checksum). [`serve_on`] answers clients on a TCP listener one after
//! another (`gdx serve --rdma-listen`); [`run_loopback`] runs both sides in this process.
//!
//! Method, per message size: `warmup` operations, then `samples` samples of `iterations`
//! operations (fewer for large sizes when `max_bytes_per_sample` is set), each sample one
//! batch posted and waited for ([`Link::run`]); then as many single operations each timed
//! from post to completion (latency: one round trip, not perftest's half). The summary is the
//! bench framework's ([`crate::figures::fill_row`]). Host buffers hold a seeded pattern and are
//! checked at the end (GPU buffers are not checked).

use super::proto::{recv, send, BenchMem, BenchOp, Control, Msg, TcpControl, BENCH_VERSION};
use gdx_rdma::link::{pattern_checksum, Link, Side};
use gdx_rdma::{EndpointConfig, Mechanism, RdmaError};
use gdx_topo::sysfs::counters::{deltas, read_port_counters, CounterDeltas};
use gdx_topo::sysfs::RootFs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use gdx_base::clock::wall;

/// Seed of the client's host pattern.
const CLIENT_SEED: u8 = 1;
/// Seed of the server's host pattern.
const SERVER_SEED: u8 = 2;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaParams {
    /// Operation.
    pub op: BenchOp,
    /// This side's memory.
    pub local: BenchMem,
    /// The peer's memory.
    pub remote: BenchMem,
    /// Message sizes in bytes.
    pub sizes: Vec<u64>,
    /// Operations per sample (and latency iterations).
    pub iterations: u32,
    /// Operations before measuring.
    pub warmup: u32,
    /// Bandwidth samples per size.
    pub samples: u32,
    /// RDMA device; `None` picks the NIC nearest to the local memory.
    pub device: Option<String>,
    /// Endpoint settings (queue pairs per peer, depth, GID ...).
    pub config: EndpointConfig,
    /// Wait limit for any single step.
    pub timeout: Duration,
    /// At most this many bytes per bandwidth sample (and latency run): large sizes then run
    /// fewer than `iterations` operations (at least one). `None`: `iterations` at every size.
    pub max_bytes_per_sample: Option<u64>,
    /// Fit each size's operations per sample to about this long at the rate its warm-up
    /// measured (never more than the other limits allow). `None`: no fitting.
    pub sample_time: Option<Duration>,
}

impl RdmaParams {
    /// Operations per sample at `size` bytes: `iterations`, capped by `max_bytes_per_sample`.
    pub fn iterations_for(&self, size: u64) -> u32 {
        let n = self.iterations.max(1);
        match self.max_bytes_per_sample {
            Some(b) => {
                let fit = b / size.max(1);
                u32::try_from(fit).unwrap_or(u32::MAX).clamp(1, n)
            }
            None => n,
        }
    }
}

impl Default for RdmaParams {
    fn default() -> Self {
        RdmaParams {
            op: BenchOp::Write,
            local: BenchMem::Host,
            remote: BenchMem::Host,
            sizes: (12..=26).step_by(2).map(|s| 1u64 << s).collect(),
            iterations: 1000,
            warmup: 100,
            samples: 3,
            device: None,
            config: EndpointConfig::default(),
            timeout: Duration::from_secs(30),
            max_bytes_per_sample: None,
            sample_time: None,
        }
    }
}

/// The raw timings of one message size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeTimes {
    /// Message size in bytes.
    pub size: u64,
    /// Operations per bandwidth sample (and latency samples taken).
    pub iterations: u32,
    /// Elapsed time of each bandwidth sample (`iterations` operations).
    pub samples: Vec<Duration>,
    /// Post-to-completion time of each single operation.
    pub latencies: Vec<Duration>,
    /// What the local port's loss and congestion counters did over this size's operations
    /// (warm-up to the last latency sample).
    pub counters: Option<CounterDeltas>,
}

/// A finished client run.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaRun {
    /// Local device and port.
    pub local_device: String,
    /// Peer's device and port.
    pub remote_device: String,
    /// How the local buffer was registered.
    pub local_mechanism: Mechanism,
    /// How the peer's buffer was registered.
    pub remote_mechanism: Mechanism,
    /// Queue pairs used.
    pub qps: usize,
    /// Whether the host-memory pattern check passed (`None`: not checked, GPU memory).
    pub verified: Option<bool>,
    /// One entry per size.
    pub sizes: Vec<SizeTimes>,
}

/// Time one size on a connected link: warm-up, bandwidth samples, latencies.
fn time_size(
    link: &mut Link,
    region: &gdx_rdma::RemoteRegion,
    p: &RdmaParams,
    size: u64,
) -> Result<SizeTimes, RdmaError> {
    let op = p.op.into();
    let warm = p.warmup.max(1);
    // The NIC's own counters around the size: loss that RC retransmission hides from the
    // completions shows here (sysfs of this machine; the peer's port is not read).
    let sysfs = RootFs::new("/");
    let (dev, port) = link.local_port();
    let before = read_port_counters(&sysfs, &dev, port);
    let (done, warm_d) = wall(|| link.run(op, region, size, warm, p.timeout));
    done?;
    let warm_s = warm_d.as_secs_f64();
    let mut iterations = p.iterations_for(size);
    if let Some(target) = p.sample_time.filter(|_| warm_s > 0.0) {
        // The warm-up's rate includes its latency, so it errs towards shorter samples.
        let rate = (size * u64::from(warm)) as f64 / warm_s;
        let fit = (target.as_secs_f64() * rate / size.max(1) as f64) as u64;
        iterations = iterations.min(u32::try_from(fit).unwrap_or(u32::MAX).max(1));
    }
    let mut samples = Vec::new();
    for _ in 0..p.samples.max(1) {
        let (done, d) = wall(|| link.run(op, region, size, iterations, p.timeout));
        done?;
        samples.push(d);
    }
    let mut latencies = Vec::new();
    for _ in 0..iterations {
        let (done, d) = wall(|| link.run(op, region, size, 1, p.timeout));
        done?;
        latencies.push(d);
    }
    let after = read_port_counters(&sysfs, &dev, port);
    Ok(SizeTimes {
        size,
        iterations,
        samples,
        latencies,
        counters: Some(deltas(&before, &after)),
    })
}

/// Run the client side against a peer in [`serve`].
///
/// # Errors
/// [`RdmaError::InvalidArgument`] without sizes; gdx-rdma's errors for the link (typed
/// [`RdmaError::Unavailable`] before anything is sent when this side has no RDMA);
/// [`RdmaError::Control`] when the peer fails or says something unexpected.
pub fn run_client(ctrl: &mut dyn Control, p: &RdmaParams) -> Result<RdmaRun, RdmaError> {
    let max = p
        .sizes
        .iter()
        .copied()
        .max()
        .filter(|m| *m > 0)
        .ok_or_else(|| RdmaError::InvalidArgument("no message sizes".into()))?;
    let len =
        usize::try_from(max).map_err(|_| RdmaError::InvalidArgument("size too large".into()))?;
    let side = Side::open(
        p.local.into(),
        len,
        CLIENT_SEED,
        p.device.as_deref(),
        &p.config,
        0,
    )?;
    send(
        ctrl,
        &Msg::Hello {
            version: BENCH_VERSION,
            op: p.op,
            mem: p.remote,
            len: max,
            qps: side.conn_data().qps.len() as u16,
            conn: side.conn_data().clone(),
        },
    )?;
    let Msg::Ready {
        conn,
        region,
        mechanism,
    } = recv(ctrl, p.timeout)?
    else {
        return Err(RdmaError::Control("expected ready".into()));
    };
    let mut link = side.connect(&conn)?;
    let mut sizes = Vec::new();
    for &size in &p.sizes {
        sizes.push(time_size(&mut link, &region, p, size)?);
        send(ctrl, &Msg::Progress { size })?;
    }
    // Verify: after writes the peer holds our pattern; after reads we hold the peer's.
    send(ctrl, &Msg::Checksum { len: max })?;
    let Msg::Sum { value } = recv(ctrl, p.timeout)? else {
        return Err(RdmaError::Control("expected checksum".into()));
    };
    let (expect, got) = match p.op {
        BenchOp::Write => (link.checksum(len), value),
        BenchOp::Read => (Some(pattern_checksum(len, SERVER_SEED)), link.checksum(len)),
    };
    let verified = match (expect, got, p.local, p.remote) {
        (Some(e), Some(g), BenchMem::Host, BenchMem::Host) => Some(e == g),
        _ => None,
    };
    send(ctrl, &Msg::Done)?;
    Ok(RdmaRun {
        local_device: link.local_device(),
        remote_device: link.remote_device(),
        local_mechanism: link.mechanism(),
        remote_mechanism: mechanism,
        qps: link.qps(),
        verified,
        sizes,
    })
}

/// Serve one bench client on `ctrl`: allocate and register the requested buffer, connect,
/// answer the checksum, and return when the client is done. A set-up failure is sent to the
/// client as the reason before it is returned.
///
/// # Errors
/// The set-up's gdx-rdma error; [`RdmaError::Control`] for a protocol version mismatch, a
/// failed channel or an unexpected message.
pub fn serve(
    ctrl: &mut dyn Control,
    device: Option<&str>,
    config: &EndpointConfig,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let Msg::Hello {
        version,
        mem,
        len,
        qps,
        conn,
        ..
    } = recv(ctrl, timeout)?
    else {
        return Err(RdmaError::Control("expected hello".into()));
    };
    let fail = |ctrl: &mut dyn Control, e: RdmaError| {
        // The client hears why; the error returned here is the one that matters.
        if let Err(s) = send(
            ctrl,
            &Msg::Error {
                reason: e.to_string(),
            },
        ) {
            log::debug!("could not tell the bench client why: {s}");
        }
        e
    };
    if version != BENCH_VERSION {
        return Err(fail(
            ctrl,
            RdmaError::Control(format!("bench version {version}, expected {BENCH_VERSION}")),
        ));
    }
    let size =
        usize::try_from(len).map_err(|_| fail(ctrl, RdmaError::InvalidArgument("size".into())))?;
    let setup = (|| {
        let mut side = Side::open(mem.into(), size, SERVER_SEED, device, config, qps)?;
        let region = side.advertise_buffer()?;
        let local = side.conn_data().clone();
        let mechanism = side.mechanism();
        let link = side.connect(&conn)?;
        Ok::<_, RdmaError>((link, local, region, mechanism))
    })();
    let (link, local, region, mechanism) = setup.map_err(|e| match e {
        RdmaError::Library(u) => {
            if let Err(s) = send(
                ctrl,
                &Msg::Unavailable {
                    library: u.library.clone(),
                    reason: u.reason.clone(),
                },
            ) {
                log::debug!("could not tell the bench client why: {s}");
            }
            RdmaError::Library(u)
        }
        e => fail(ctrl, e),
    })?;
    send(
        ctrl,
        &Msg::Ready {
            conn: local,
            region,
            mechanism,
        },
    )?;
    loop {
        match recv(ctrl, timeout)? {
            Msg::Checksum { len } => {
                let value = link.checksum(len as usize);
                send(ctrl, &Msg::Sum { value })?;
            }
            Msg::Progress { .. } => {}
            Msg::Done => return Ok(()),
            other => return Err(RdmaError::Control(format!("unexpected {other:?}"))),
        }
    }
}

/// Run [`run_client`] against a [`serve`] in a thread of this process, over a TCP control
/// connection on 127.0.0.1 (the RDMA traffic loops through the NIC). Without RDMA this fails
/// with [`RdmaError::Unavailable`] before anything is sent.
///
/// # Errors
/// The client's error, else the server's as [`RdmaError::Control`].
pub fn run_loopback(p: &RdmaParams) -> Result<RdmaRun, RdmaError> {
    use super::proto::io;
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let (device, config, timeout) = (p.device.clone(), p.config.clone(), p.timeout);
    let server = std::thread::Builder::new()
        .name("gdx-rdma-bench-serve".into())
        .spawn(move || {
            let (s, _) = listener.accept().map_err(io)?;
            serve(&mut TcpControl(s), device.as_deref(), &config, timeout)
        })
        .map_err(io)?;
    // Connected before the client starts, so the server's accept returns whatever happens;
    // dropping the stream afterwards ends the server's wait.
    let mut ctrl = TcpControl(TcpStream::connect(addr).map_err(io)?);
    let result = run_client(&mut ctrl, p);
    drop(ctrl);
    let served = server
        .join()
        .unwrap_or_else(|_| Err(RdmaError::Control("the serving thread panicked".into())));
    match (result, served) {
        (Ok(r), Ok(())) => Ok(r),
        (Ok(_), Err(e)) => Err(RdmaError::Control(format!("loopback server: {e}"))),
        (Err(e), _) => Err(e),
    }
}

/// Answer bench clients on `listener`, one after another, until accepting fails: each
/// connection is one [`serve`]. `done` hears each client's address and how its run ended (a
/// client without RDMA on this side gets the reason as an error message first).
///
/// # Errors
/// The listener's accept error, which ends the loop.
pub fn serve_on(
    listener: &TcpListener,
    device: Option<&str>,
    config: &EndpointConfig,
    timeout: Duration,
    done: &mut dyn FnMut(SocketAddr, Result<(), RdmaError>),
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept()?;
        let r = serve(&mut TcpControl(stream), device, config, timeout);
        done(peer, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel the client must not touch: it fails before talking.
    struct Never;
    impl Control for Never {
        fn send(&mut self, _: &[u8]) -> Result<(), RdmaError> {
            panic!("sent a message although the run cannot start")
        }
        fn recv(&mut self, _: Duration) -> Result<Vec<u8>, RdmaError> {
            panic!("waited for the peer although the run cannot start")
        }
    }

    #[test]
    fn without_rdma_the_client_fails_typed_before_talking() {
        // On a machine with RDMA the hardware tests cover this path.
        let absent = gdx_rdma::discover().is_err();
        if !gdx_base::testenv::precondition("no RDMA device", absent) {
            return;
        }
        let p = RdmaParams {
            sizes: vec![4096],
            ..RdmaParams::default()
        };
        assert!(matches!(
            run_client(&mut Never, &p),
            Err(RdmaError::Unavailable(_))
        ));
    }

    #[test]
    fn no_sizes_is_an_invalid_argument() {
        let p = RdmaParams {
            sizes: vec![],
            ..RdmaParams::default()
        };
        assert!(matches!(
            run_client(&mut Never, &p),
            Err(RdmaError::InvalidArgument(_))
        ));
    }

    #[test]
    fn large_sizes_run_fewer_iterations() {
        let p = RdmaParams {
            iterations: 1000,
            max_bytes_per_sample: Some(1 << 30),
            ..RdmaParams::default()
        };
        assert_eq!(p.iterations_for(4096), 1000);
        assert_eq!(p.iterations_for(1 << 26), 16);
        assert_eq!(p.iterations_for(1 << 32), 1);
        let fixed = RdmaParams {
            iterations: 7,
            ..RdmaParams::default()
        };
        assert_eq!(fixed.iterations_for(1 << 32), 7);
    }

    #[test]
    fn loopback_without_rdma_fails_typed_and_returns() {
        // On a machine with RDMA the hardware tests cover this path.
        let absent = gdx_rdma::discover().is_err();
        if !gdx_base::testenv::precondition("no RDMA device", absent) {
            return;
        }
        let p = RdmaParams {
            sizes: vec![4096],
            timeout: Duration::from_secs(5),
            ..RdmaParams::default()
        };
        assert!(matches!(run_loopback(&p), Err(RdmaError::Unavailable(_))));
    }
}
