//! Perftest-style RDMA WRITE / READ bandwidth and latency, host or GPU memory on either side,
//! against a peer running [`serve_bench`] (what `gdx serve` runs for `gdx bench --peer`).
//!
//! The two sides talk over a [`Control`] channel (a TCP stream in practice, [`TcpControl`]):
//! JSON messages carrying each side's [`ConnData`] and the server's buffer as a
//! [`RemoteRegion`]. The client then drives one-sided operations only. [`serve_bench_on`]
//! answers clients on a TCP listener one after another (`gdx serve --rdma-listen`);
//! [`bench_loopback`] runs both sides in this process (`gdx bench --path rdma` without a peer).
//!
//! Method, per message size: `warmup` operations, then `samples` samples of `iterations`
//! operations (fewer for large sizes when `max_bytes_per_sample` is set) with `window` of them in flight (bandwidth = bytes / elapsed), then
//! `iterations` single operations each timed from post to completion (latency: this is
//! post-to-completion, i.e. one round trip, not perftest's half round trip). Host buffers are
//! filled with a seeded pattern and checked at the end (GPU buffers are not checked).
//! GB/s = 1e9 B/s.

use crate::conn::{ConnData, RemoteRegion};
use crate::endpoint::{EndpointConfig, RdmaEndpoint};
use crate::error::RdmaError;
use crate::nic::{choose_nics, GpuRef, MemPlace};
use crate::qp::{Qp, WorkItem};
use crate::register::{Mechanism, Memory};
use crate::RdmaOp;
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Protocol version of the bench messages.
pub const BENCH_VERSION: u32 = 1;
/// Largest control message.
const MAX_MSG: usize = 1 << 20;

/// Which operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    /// RDMA WRITE (local → remote).
    Write,
    /// RDMA READ (remote → local).
    Read,
}

/// Where a side's buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchMem {
    /// Host memory.
    Host,
    /// GPU memory (CUDA ordinal).
    Gpu(u32),
}

impl BenchMem {
    /// `host` or `gpu<n>`, as bench keys spell it.
    pub fn name(self) -> String {
        match self {
            BenchMem::Host => "host".into(),
            BenchMem::Gpu(n) => format!("gpu{n}"),
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchParams {
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
    /// Bandwidth samples per size (median reported).
    pub samples: u32,
    /// Operations in flight for bandwidth.
    pub window: u32,
    /// RDMA device; `None` picks the NIC nearest to the local memory.
    pub device: Option<String>,
    /// Endpoint settings (queue pairs per peer, depth, GID ...).
    pub config: EndpointConfig,
    /// Wait limit for any single step.
    pub timeout: Duration,
    /// At most this many bytes per bandwidth sample (and latency run): large sizes then run
    /// fewer than `iterations` operations (at least one). `None`: `iterations` at every size.
    pub max_bytes_per_sample: Option<u64>,
}

impl BenchParams {
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

impl Default for BenchParams {
    fn default() -> Self {
        BenchParams {
            op: BenchOp::Write,
            local: BenchMem::Host,
            remote: BenchMem::Host,
            sizes: (12..=26).step_by(2).map(|s| 1u64 << s).collect(),
            iterations: 1000,
            warmup: 100,
            samples: 3,
            window: 64,
            device: None,
            config: EndpointConfig::default(),
            timeout: Duration::from_secs(30),
            max_bytes_per_sample: None,
        }
    }
}

/// Results for one message size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRow {
    /// Message size in bytes.
    pub size: u64,
    /// Operations per bandwidth sample (and latency samples taken).
    pub iterations: u32,
    /// Bandwidth samples in B/s.
    pub bandwidth_samples: Vec<f64>,
    /// Median bandwidth in B/s.
    pub bandwidth_median: f64,
    /// Post-to-completion latency samples in seconds.
    pub latency_samples: Vec<f64>,
    /// Median latency in seconds.
    pub latency_median: f64,
}

/// A finished bench.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// `<src>_to_<dst>_rdma_<op>`, e.g. `gpu0_to_remote_host_rdma_write`.
    pub key: String,
    /// Local device and port.
    pub local_device: String,
    /// Peer's device.
    pub remote_device: String,
    /// How the local buffer was registered.
    pub local_mechanism: Mechanism,
    /// How the peer's buffer was registered.
    pub remote_mechanism: Mechanism,
    /// Queue pairs used.
    pub qps: usize,
    /// Whether the host-memory pattern check passed (`None`: not checked, GPU memory).
    pub verified: Option<bool>,
    /// One row per size.
    pub rows: Vec<BenchRow>,
}

/// The bench key for an operation between two memories.
pub fn bench_key(op: BenchOp, local: BenchMem, remote: BenchMem) -> String {
    match op {
        BenchOp::Write => format!("{}_to_remote_{}_rdma_write", local.name(), remote.name()),
        BenchOp::Read => format!("remote_{}_to_{}_rdma_read", remote.name(), local.name()),
    }
}

/// A message channel between the two bench sides.
pub trait Control {
    /// Send one message.
    fn send(&mut self, msg: &[u8]) -> Result<(), RdmaError>;
    /// Receive one message, waiting at most `timeout`.
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, RdmaError>;
}

/// [`Control`] over a TCP stream: each message is a little-endian u32 length and the bytes.
#[derive(Debug)]
pub struct TcpControl(pub TcpStream);

fn io(e: std::io::Error) -> RdmaError {
    RdmaError::Control(e.to_string())
}

impl Control for TcpControl {
    fn send(&mut self, msg: &[u8]) -> Result<(), RdmaError> {
        write_frame(&mut self.0, msg)
    }
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, RdmaError> {
        self.0
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(io)?;
        read_frame(&mut self.0)
    }
}

/// Write one length-prefixed frame.
pub fn write_frame(w: &mut impl Write, msg: &[u8]) -> Result<(), RdmaError> {
    if msg.len() > MAX_MSG {
        return Err(RdmaError::Control(format!(
            "message of {} bytes is too large",
            msg.len()
        )));
    }
    w.write_all(&(msg.len() as u32).to_le_bytes()).map_err(io)?;
    w.write_all(msg).map_err(io)?;
    w.flush().map_err(io)
}

/// Read one length-prefixed frame (at most 1 MiB).
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, RdmaError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(io)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MSG {
        return Err(RdmaError::Control(format!(
            "peer announced a {len}-byte message"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
enum Msg {
    Hello {
        version: u32,
        op: BenchOp,
        mem: BenchMem,
        len: u64,
        qps: u16,
        conn: ConnData,
    },
    Ready {
        conn: ConnData,
        region: RemoteRegion,
        mechanism: Mechanism,
    },
    /// Sent by the client after each size, so the server's waits stay short.
    Progress {
        size: u64,
    },
    Checksum {
        len: u64,
    },
    Sum {
        value: Option<u64>,
    },
    Done,
    Error {
        reason: String,
    },
}

fn send(c: &mut dyn Control, m: &Msg) -> Result<(), RdmaError> {
    let b = serde_json::to_vec(m).map_err(|e| RdmaError::Control(e.to_string()))?;
    c.send(&b)
}

fn recv(c: &mut dyn Control, timeout: Duration) -> Result<Msg, RdmaError> {
    let b = c.recv(timeout)?;
    match serde_json::from_slice(&b).map_err(|e| RdmaError::Control(format!("bad message: {e}")))? {
        Msg::Error { reason } => Err(RdmaError::Control(format!("peer: {reason}"))),
        m => Ok(m),
    }
}

/// A bench buffer: host bytes or a GPU allocation, with its registration memory.
enum Buffer {
    Host(Vec<u8>),
    Gpu(Arc<DeviceBuffer>),
}

impl Buffer {
    fn new(mem: BenchMem, len: usize, seed: u8) -> Result<Buffer, RdmaError> {
        match mem {
            BenchMem::Host => Ok(Buffer::Host((0..len).map(|i| pattern(i, seed)).collect())),
            BenchMem::Gpu(n) => {
                let cuda = Cuda::load().map_err(|u| RdmaError::InvalidArgument(u.to_string()))?;
                let ctx = Context::new(&cuda.device(n)?)?;
                Ok(Buffer::Gpu(Arc::new(DeviceBuffer::new(&ctx, len)?)))
            }
        }
    }

    fn memory(&mut self) -> Memory {
        match self {
            // SAFETY: the vector outlives every registration of it: each bench function
            // declares the buffer before the endpoint and the connection, so both (and the
            // endpoint's cache) are dropped first; its bytes are only read after all
            // operations completed.
            Buffer::Host(v) => unsafe { Memory::host(v.as_mut_ptr(), v.len()) },
            Buffer::Gpu(b) => Memory::gpu(Arc::clone(b)),
        }
    }

    fn checksum(&self, len: usize) -> Option<u64> {
        match self {
            Buffer::Host(v) => Some(checksum(&v[..len.min(v.len())])),
            Buffer::Gpu(_) => None,
        }
    }
}

fn pattern(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed)
}

/// [`checksum`] of `len` bytes of [`pattern`] with `seed`, without building them.
fn pattern_checksum(len: usize, seed: u8) -> u64 {
    (0..len).fold(FNV_OFFSET, |h, i| fnv(h, pattern(i, seed)))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(h: u64, x: u8) -> u64 {
    (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(FNV_OFFSET, |h, x| fnv(h, *x))
}

fn place(mem: BenchMem) -> Result<MemPlace, RdmaError> {
    Ok(match mem {
        BenchMem::Host => MemPlace::Host { numa: None },
        BenchMem::Gpu(n) => {
            let cuda = Cuda::load().map_err(|u| RdmaError::InvalidArgument(u.to_string()))?;
            let bdf = cuda.device(n)?.pci_bus_id()?;
            let bdf = bdf
                .parse()
                .map_err(|e| RdmaError::InvalidArgument(format!("GPU {n}: {e}")))?;
            MemPlace::Gpu(GpuRef::Bdf(bdf))
        }
    })
}

fn open_for(
    mem: BenchMem,
    device: Option<&str>,
    config: &EndpointConfig,
) -> Result<RdmaEndpoint, RdmaError> {
    let devices = crate::discovery::discover()?;
    let name = match device {
        Some(d) => d.to_string(),
        None => {
            let topo = gdx_topo::discover().map_err(|e| RdmaError::InvalidArgument(e.to_string()));
            match topo.and_then(|t| Ok(choose_nics(&t, &place(mem)?)?)) {
                Ok(c) => c.rails[0].device.clone(),
                Err(e) => {
                    log::warn!("no topology-based NIC choice ({e}); using the first device");
                    devices[0].name.clone()
                }
            }
        }
    };
    RdmaEndpoint::open(&name, config.clone())
}

/// Run the client side against a peer in [`serve_bench`].
pub fn bench_rdma(ctrl: &mut dyn Control, p: &BenchParams) -> Result<BenchReport, RdmaError> {
    let max = p
        .sizes
        .iter()
        .copied()
        .max()
        .filter(|m| *m > 0)
        .ok_or_else(|| RdmaError::InvalidArgument("no message sizes".into()))?;
    let len =
        usize::try_from(max).map_err(|_| RdmaError::InvalidArgument("size too large".into()))?;
    // Declaration order is drop order reversed: buffer outlives endpoint and connection.
    let mut buf = Buffer::new(p.local, len, 1)?;
    let ep = open_for(p.local, p.device.as_deref(), &p.config)?;
    let mr = ep.register(&buf.memory())?;
    let cq = ep.completion_queue((p.config.qps_per_peer.max(1) as u32) * p.config.max_send_wr)?;
    let prepared = ep.prepare(&cq, 0)?;
    send(
        ctrl,
        &Msg::Hello {
            version: BENCH_VERSION,
            op: p.op,
            mem: p.remote,
            len: max,
            qps: prepared.conn_data().qps.len() as u16,
            conn: prepared.conn_data().clone(),
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
    let mut qp: Qp = prepared.connect(&conn)?;
    let op = match p.op {
        BenchOp::Write => RdmaOp::Write,
        BenchOp::Read => RdmaOp::Read,
    };
    let mut rows = Vec::new();
    for &size in &p.sizes {
        let item = WorkItem::between(&mr, 0, &region, 0, size)?;
        let warm: Vec<WorkItem<'_>> = (0..p.warmup).map(|_| item.clone()).collect();
        qp.run(op, &warm, p.timeout)?;
        let iterations = p.iterations_for(size);
        let mut bw = Vec::new();
        for _ in 0..p.samples.max(1) {
            let items: Vec<WorkItem<'_>> = (0..iterations).map(|_| item.clone()).collect();
            let t = Instant::now();
            let bytes = qp.run(op, &items, p.timeout)?;
            bw.push(bytes as f64 / t.elapsed().as_secs_f64());
        }
        let mut lat = Vec::new();
        for _ in 0..iterations {
            let t = Instant::now();
            qp.run(op, std::slice::from_ref(&item), p.timeout)?;
            lat.push(t.elapsed().as_secs_f64());
        }
        rows.push(BenchRow {
            size,
            iterations,
            bandwidth_median: gdx_sys::stats::median(&bw).unwrap_or(0.0),
            bandwidth_samples: bw,
            latency_median: gdx_sys::stats::median(&lat).unwrap_or(0.0),
            latency_samples: lat,
        });
        send(ctrl, &Msg::Progress { size })?;
    }
    // Verify: after writes the peer holds our pattern; after reads we hold the peer's.
    send(ctrl, &Msg::Checksum { len: max })?;
    let Msg::Sum { value } = recv(ctrl, p.timeout)? else {
        return Err(RdmaError::Control("expected checksum".into()));
    };
    let expect = match p.op {
        BenchOp::Write => buf.checksum(len),
        BenchOp::Read => Some(pattern_checksum(len, 2)),
    };
    let got = match p.op {
        BenchOp::Write => value,
        BenchOp::Read => buf.checksum(len),
    };
    let verified = match (expect, got, p.local, p.remote) {
        (Some(e), Some(g), BenchMem::Host, BenchMem::Host) => Some(e == g),
        _ => None,
    };
    send(ctrl, &Msg::Done)?;
    let local_mechanism = mr.handle.mechanism();
    let qps = qp.local().qps.len();
    drop(qp);
    Ok(BenchReport {
        key: bench_key(p.op, p.local, p.remote),
        local_device: format!("{} port {}", ep.device(), ep.port().number),
        remote_device: format!("{} port {}", conn.device, conn.port),
        local_mechanism,
        remote_mechanism: mechanism,
        qps,
        verified,
        rows,
    })
}

/// Serve one bench client on `ctrl`: allocate and register the requested buffer, connect,
/// answer the checksum, and return when the client is done.
pub fn serve_bench(
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
        let _ = send(
            ctrl,
            &Msg::Error {
                reason: e.to_string(),
            },
        );
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
        let mut buf = Buffer::new(mem, size, 2)?;
        let ep = open_for(mem, device, config)?;
        let mr = ep.register(&buf.memory())?;
        let cq = ep.completion_queue(u32::from(qps.max(1)) * config.max_send_wr)?;
        let mut prepared = ep.prepare(&cq, qps)?;
        let region = mr
            .handle
            .remote_region(1)
            .ok_or_else(|| RdmaError::NotRegistered {
                what: "bench buffer".into(),
            })?;
        prepared.advertise([region]);
        let local = prepared.conn_data().clone();
        let qp = prepared.connect(&conn)?;
        Ok::<_, RdmaError>((buf, ep, mr, qp, local, region))
    })();
    let (buf, _ep, mr, _qp, local, region) = setup.map_err(|e| fail(ctrl, e))?;
    send(
        ctrl,
        &Msg::Ready {
            conn: local,
            region,
            mechanism: mr.handle.mechanism(),
        },
    )?;
    loop {
        match recv(ctrl, timeout)? {
            Msg::Checksum { len } => {
                let value = buf.checksum(len as usize);
                send(ctrl, &Msg::Sum { value })?;
            }
            Msg::Progress { .. } => {}
            Msg::Done => return Ok(()),
            other => return Err(RdmaError::Control(format!("unexpected {other:?}"))),
        }
    }
}

/// Run [`bench_rdma`] against a [`serve_bench`] in a thread of this process, over a TCP
/// control connection on 127.0.0.1 (the RDMA traffic loops through the NIC). Without RDMA this
/// fails with [`RdmaError::Unavailable`] before anything is sent.
pub fn bench_loopback(p: &BenchParams) -> Result<BenchReport, RdmaError> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let (device, config, timeout) = (p.device.clone(), p.config.clone(), p.timeout);
    let server = std::thread::Builder::new()
        .name("gdx-rdma-bench-serve".into())
        .spawn(move || {
            let (s, _) = listener.accept().map_err(io)?;
            serve_bench(&mut TcpControl(s), device.as_deref(), &config, timeout)
        })
        .map_err(io)?;
    // Connected before the client starts, so the server's accept returns whatever happens;
    // dropping the stream afterwards ends the server's wait.
    let mut ctrl = TcpControl(TcpStream::connect(addr).map_err(io)?);
    let result = bench_rdma(&mut ctrl, p);
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
/// connection is one [`serve_bench`]. `done` hears each client's address and how its run
/// ended (a client without RDMA on this side gets the reason as an error message first).
pub fn serve_bench_on(
    listener: &TcpListener,
    device: Option<&str>,
    config: &EndpointConfig,
    timeout: Duration,
    done: &mut dyn FnMut(SocketAddr, Result<(), RdmaError>),
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept()?;
        let r = serve_bench(&mut TcpControl(stream), device, config, timeout);
        done(peer, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_bench_naming() {
        assert_eq!(
            bench_key(BenchOp::Write, BenchMem::Gpu(0), BenchMem::Host),
            "gpu0_to_remote_host_rdma_write"
        );
        assert_eq!(
            bench_key(BenchOp::Read, BenchMem::Host, BenchMem::Gpu(1)),
            "remote_gpu1_to_host_rdma_read"
        );
    }

    #[test]
    fn frames_round_trip_and_refuse_huge_lengths() {
        let mut v = Vec::new();
        write_frame(&mut v, b"hello").unwrap();
        assert_eq!(read_frame(&mut v.as_slice()).unwrap(), b"hello");
        let huge = ((MAX_MSG as u32) + 1).to_le_bytes();
        assert!(read_frame(&mut huge.as_slice()).is_err());
        assert!(read_frame(&mut [1u8, 0].as_slice()).is_err());
    }

    #[test]
    fn pattern_checksum_matches_a_built_buffer() {
        let b = Buffer::new(BenchMem::Host, 10_000, 2).unwrap();
        assert_eq!(b.checksum(10_000), Some(pattern_checksum(10_000, 2)));
        assert_ne!(pattern_checksum(10_000, 1), pattern_checksum(10_000, 2));
    }

    #[test]
    fn messages_round_trip_as_json() {
        let m = Msg::Progress { size: 4096 };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, r#"{"msg":"progress","size":4096}"#);
        assert!(matches!(
            serde_json::from_str(&j).unwrap(),
            Msg::Progress { size: 4096 }
        ));
    }

    #[test]
    fn without_rdma_the_bench_fails_typed_before_talking() {
        struct Never;
        impl Control for Never {
            fn send(&mut self, _: &[u8]) -> Result<(), RdmaError> {
                panic!("sent a message although no RDMA device exists")
            }
            fn recv(&mut self, _: Duration) -> Result<Vec<u8>, RdmaError> {
                panic!("waited for the peer although no RDMA device exists")
            }
        }
        if crate::discovery::discover().is_ok() {
            return; // a machine with RDMA: nothing to check here
        }
        let p = BenchParams {
            sizes: vec![4096],
            ..BenchParams::default()
        };
        assert!(matches!(
            bench_rdma(&mut Never, &p),
            Err(RdmaError::Unavailable(_))
        ));
    }

    #[test]
    fn large_sizes_run_fewer_iterations() {
        let p = BenchParams {
            iterations: 1000,
            max_bytes_per_sample: Some(1 << 30),
            ..BenchParams::default()
        };
        assert_eq!(p.iterations_for(4096), 1000);
        assert_eq!(p.iterations_for(1 << 26), 16);
        assert_eq!(p.iterations_for(1 << 32), 1);
        let fixed = BenchParams {
            iterations: 7,
            ..BenchParams::default()
        };
        assert_eq!(fixed.iterations_for(1 << 32), 7);
    }

    #[test]
    fn loopback_without_rdma_fails_typed_and_returns() {
        if crate::discovery::discover().is_ok() {
            return; // a machine with RDMA: the hardware tests cover it
        }
        let p = BenchParams {
            sizes: vec![4096],
            timeout: Duration::from_secs(5),
            ..BenchParams::default()
        };
        assert!(matches!(bench_loopback(&p), Err(RdmaError::Unavailable(_))));
    }
}
