//! The HTTP/1.x server under `/metrics` and `/health`: small and bounded, because anyone who
//! can reach the port may talk to it unauthenticated.
//!
//! Every connection gets its own thread and one request (`Connection: close`), so a client
//! that pipelines requests and never reads stalls only itself, and `/health` is never queued
//! behind `/metrics`. The request head is read into a fixed buffer ([`HttpLimits::max_head_bytes`],
//! [`HttpLimits::max_headers`] lines) within one deadline ([`HttpLimits::read_timeout`]), the
//! response is written within [`HttpLimits::write_timeout`]; methods other than GET and HEAD get
//! 405. At most [`HttpLimits::max_connections`] connections are served at once: a newcomer beyond
//! shuts one down, chosen by `gdx_base::shed` (one already answered first, then one that has
//! sent nothing, from the network and then the address holding the most, ties to the source
//! whose connections most often ended without a request): a flood of silent or half-sent
//! connections from other sources cannot lock a slow health checker out, as shedding the oldest
//! did.
//! tiny_http, used before, had none of these bounds and served requests of all connections on
//! one thread.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{ClusterError, Result};

/// The bounds of the metrics endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Whole request head, from accept to its blank line.
    pub read_timeout: Duration,
    /// Writing the response.
    pub write_timeout: Duration,
    /// Request line plus headers (bytes); beyond, 431.
    pub max_head_bytes: usize,
    /// Header lines; beyond, 431.
    pub max_headers: usize,
    /// Connections served at once; a newcomer beyond shuts one down (`gdx_base::shed` chooses).
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_head_bytes: 8 << 10,
            max_headers: 64,
            max_connections: 32,
        }
    }
}

/// What a handler returns: status, content type, body.
pub(crate) type Reply = (u16, &'static str, String);

/// Counters of the endpoint's own bounds.
#[derive(Debug, Default)]
pub(crate) struct HttpHits {
    /// Connections shut down for a newer one (`max_connections`).
    pub(crate) evicted: AtomicU64,
    /// Requests refused: head too large, too many headers, not finished in time, bad method.
    pub(crate) refused: AtomicU64,
}

/// How far an open connection got: nothing sent yet, its request being read, answered.
const SILENT: u8 = 0;
const SPOKE: u8 = 1;
const ANSWERED: u8 = 2;

/// One open connection: its id, source, progress and a handle to shut it down with.
struct Open {
    id: u64,
    addr: Option<IpAddr>,
    state: Arc<AtomicU8>,
    sock: TcpStream,
}

struct Shared {
    limits: HttpLimits,
    stop: AtomicBool,
    /// Open connections, oldest first.
    open: Mutex<(u64, VecDeque<Open>)>,
    /// Which sources' connections ended without a request, lately.
    record: gdx_base::shed::Record,
    hits: Arc<HttpHits>,
}

/// A running server; dropping it stops accepting and shuts open connections down.
pub(crate) struct HttpServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl HttpServer {
    /// Serves `handler(path)` on `addr`.
    pub(crate) fn start(
        addr: SocketAddr,
        limits: HttpLimits,
        hits: Arc<HttpHits>,
        handler: impl Fn(&str) -> Reply + Send + Sync + 'static,
    ) -> Result<HttpServer> {
        let l = TcpListener::bind(addr)
            .map_err(|e| ClusterError::io(format!("binding the metrics endpoint {addr}"), e))?;
        let bound = l
            .local_addr()
            .map_err(|e| ClusterError::io("metrics endpoint address", e))?;
        let shared = Arc::new(Shared {
            limits,
            stop: AtomicBool::new(false),
            open: Mutex::new((0, VecDeque::new())),
            record: gdx_base::shed::Record::default(),
            hits,
        });
        let s = Arc::clone(&shared);
        let handler = Arc::new(handler);
        std::thread::Builder::new()
            .name("gdx-metrics".into())
            .spawn(move || accept(&s, &l, &handler))
            .map_err(|e| ClusterError::io("spawning the metrics thread", e))?;
        Ok(HttpServer {
            shared,
            addr: bound,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let wake = if self.addr.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], self.addr.port()))
        } else {
            self.addr
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        let g = self.shared.open.lock().unwrap_or_else(|p| p.into_inner());
        for o in &g.1 {
            let _ = o.sock.shutdown(Shutdown::Both);
        }
    }
}

fn accept<H: Fn(&str) -> Reply + Send + Sync + 'static>(
    s: &Arc<Shared>,
    l: &TcpListener,
    handler: &Arc<H>,
) {
    for conn in l.incoming() {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let Ok(handle) = conn.try_clone() else {
            continue;
        };
        let addr = conn.peer_addr().ok().map(|a| a.ip());
        let state = Arc::new(AtomicU8::new(SILENT));
        let id = {
            let mut g = s.open.lock().unwrap_or_else(|p| p.into_inner());
            let (next, q) = &mut *g;
            while q.len() >= s.limits.max_connections {
                let Some(old) = shed(s, q) else { break };
                let _ = old.sock.shutdown(Shutdown::Both);
                s.hits.evicted.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "gdx metrics: max_connections reached, a connection from {} closed",
                    old.addr.map_or("?".into(), |a| a.to_string())
                );
            }
            *next += 1;
            q.push_back(Open {
                id: *next,
                addr,
                state: Arc::clone(&state),
                sock: handle,
            });
            *next
        };
        let (s2, h) = (Arc::clone(s), Arc::clone(handler));
        let spawned = std::thread::Builder::new()
            .name("gdx-metrics-conn".into())
            .spawn(move || {
                serve(&s2, conn, &state, &*h);
                let mut g = s2.open.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = g.1.iter().position(|o| o.id == id) {
                    g.1.remove(i);
                }
            });
        if spawned.is_err() {
            let mut g = s.open.lock().unwrap_or_else(|p| p.into_inner());
            g.1.retain(|o| o.id != id);
        }
    }
}

/// Takes the connection to shed from a full table: one already answered (it only lingers),
/// else `gdx_base::shed`'s choice.
fn shed(s: &Shared, q: &mut VecDeque<Open>) -> Option<Open> {
    use gdx_base::shed::{victim, Entry, Group};
    let i = match q
        .iter()
        .position(|o| o.state.load(Ordering::Relaxed) == ANSWERED)
    {
        Some(i) => i,
        None => {
            let entries: Vec<Entry> = q
                .iter()
                .map(|o| Entry {
                    addr: o.addr,
                    silent: o.state.load(Ordering::Relaxed) == SILENT,
                })
                .collect();
            victim(&entries, Group::Prefix, &s.record)?
        }
    };
    q.remove(i)
}

/// Why a request head was refused.
enum Bad {
    Status(u16, &'static str),
    Gone,
}

/// Reads the request head (bounded in bytes, lines and time); returns method and path.
fn read_head(
    s: &Shared,
    c: &mut TcpStream,
    state: &AtomicU8,
) -> std::result::Result<(String, String), Bad> {
    let l = &s.limits;
    let until = Instant::now() + l.read_timeout;
    let mut buf = vec![0u8; l.max_head_bytes];
    let mut n = 0;
    let end = loop {
        if let Some(i) = buf[..n].windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        // Bare-LF clients (`printf 'GET / HTTP/1.0\n\n'`) are served too.
        if let Some(i) = buf[..n].windows(2).position(|w| w == b"\n\n") {
            break i;
        }
        if n == buf.len() {
            return Err(Bad::Status(431, "request head larger than max_head_bytes"));
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || c.set_read_timeout(Some(left)).is_err() {
            return Err(Bad::Status(
                408,
                "request head not sent within read_timeout",
            ));
        }
        match c.read(&mut buf[n..]) {
            Ok(0) => return Err(Bad::Gone),
            Ok(k) => {
                n += k;
                state.store(SPOKE, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Bad::Status(
                    408,
                    "request head not sent within read_timeout",
                ))
            }
            Err(_) => return Err(Bad::Gone),
        }
        if buf[..n].iter().filter(|&&b| b == b'\n').count() > l.max_headers + 1 {
            return Err(Bad::Status(431, "more header lines than max_headers"));
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut first = head.lines().next().unwrap_or_default().split_whitespace();
    let (Some(method), Some(target)) = (first.next(), first.next()) else {
        return Err(Bad::Status(400, "malformed request line"));
    };
    let path = target.split('?').next().unwrap_or_default().to_string();
    Ok((method.to_string(), path))
}

fn serve(s: &Shared, mut c: TcpStream, state: &AtomicU8, handler: &dyn Fn(&str) -> Reply) {
    let _ = c.set_write_timeout(Some(s.limits.write_timeout));
    let head = read_head(s, &mut c, state);
    if head.is_err() {
        // No request came (evicted, timed out, closed) or a bad one: its source is shed first
        // next time among sources holding as many.
        if let Ok(a) = c.peer_addr() {
            s.record.failed(a.ip());
        }
    }
    let (code, ctype, body, head_only) = match head {
        Ok((m, path)) if m == "GET" || m == "HEAD" => {
            let (code, ctype, body) = handler(&path);
            (code, ctype, body, m == "HEAD")
        }
        Ok(_) => {
            s.hits.refused.fetch_add(1, Ordering::Relaxed);
            (
                405,
                "text/plain; charset=utf-8",
                "method not allowed: GET or HEAD only\n".to_string(),
                false,
            )
        }
        Err(Bad::Status(code, why)) => {
            s.hits.refused.fetch_add(1, Ordering::Relaxed);
            log::debug!("gdx metrics: request refused: {why}");
            (code, "text/plain; charset=utf-8", format!("{why}\n"), false)
        }
        Err(Bad::Gone) => return,
    };
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let allow = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(head.as_bytes());
    if !head_only {
        let _ = c.write_all(body.as_bytes());
    }
    state.store(ANSWERED, Ordering::Relaxed);
    if code < 400 {
        if let Ok(a) = c.peer_addr() {
            s.record.finished(a.ip());
        }
    }
    // Unread pipelined requests are dropped with the connection; a little of what the client
    // still sends is read first (bounded), so that closing with unread input (a TCP reset)
    // does not destroy the response before the client read it.
    let _ = c.shutdown(Shutdown::Write);
    let _ = c.set_read_timeout(Some(LINGER));
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < LINGER_BYTES {
        match c.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(k) => drained += k,
        }
    }
}

/// How long, and how many bytes, a connection is drained before it closes.
const LINGER: Duration = Duration::from_millis(200);
const LINGER_BYTES: usize = 64 << 10;
