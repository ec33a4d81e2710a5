//! A userspace tcp relay for rail tests: loopback has no `tc` without root, so a rail is made
//! slow or cut by sending it through this relay, which forwards every connection it accepts to
//! one target, at a rate it can be told (one token bucket for all its connections, both
//! directions) and which can be cut (every connection shut down, new ones closed at once) and
//! restored.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Bucket {
    /// Bytes per second; `None`: unlimited.
    rate: Option<f64>,
    tokens: f64,
    last: Instant,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    bucket: Mutex<Bucket>,
    cut: AtomicBool,
    stop: AtomicBool,
    live: Mutex<Vec<TcpStream>>,
}

/// A relay listening on `addr()`, forwarding to its target.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Shared {
    /// Waits until `n` bytes may pass.
    fn take(&self, n: usize) {
        loop {
            let wait = {
                let mut b = self.bucket.lock().unwrap();
                let Some(rate) = b.rate else { return };
                let now = Instant::now();
                let burst = (rate / 50.0).max(64.0 * 1024.0);
                b.tokens = (b.tokens + rate * (now - b.last).as_secs_f64()).min(burst);
                b.last = now;
                if b.tokens >= n as f64 {
                    b.tokens -= n as f64;
                    return;
                }
                (n as f64 - b.tokens) / rate
            };
            std::thread::sleep(Duration::from_secs_f64(wait.min(0.05)));
        }
    }
}

fn pump(shared: &Shared, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        shared.take(n);
        if shared.cut.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Relay {
    /// A relay on `ip` (port chosen by the kernel) to `target`, unlimited.
    pub fn start(ip: &str, target: SocketAddr) -> Relay {
        let l = TcpListener::bind((ip, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target,
            bucket: Mutex::new(Bucket {
                rate: None,
                tokens: 0.0,
                last: Instant::now(),
            }),
            cut: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            live: Mutex::new(Vec::new()),
        });
        let s = Arc::clone(&shared);
        std::thread::spawn(move || {
            for c in l.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = c else { continue };
                if s.cut.load(Ordering::SeqCst) {
                    // A cut wire: the connection is closed at once.
                    let _ = c.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(up) = TcpStream::connect(s.target) else {
                    continue;
                };
                let _ = c.set_nodelay(true);
                let _ = up.set_nodelay(true);
                {
                    let mut live = s.live.lock().unwrap();
                    live.push(c.try_clone().unwrap());
                    live.push(up.try_clone().unwrap());
                }
                let (s1, s2) = (Arc::clone(&s), Arc::clone(&s));
                let (c2, up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
                std::thread::spawn(move || pump(&s1, c, up));
                std::thread::spawn(move || pump(&s2, up2, c2));
            }
        });
        Relay { addr, shared }
    }

    /// Where rails connect to reach the target through this relay.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Limits the relay to `bytes_per_sec` (`None`: unlimited).
    pub fn set_rate(&self, bytes_per_sec: Option<u64>) {
        let mut b = self.shared.bucket.lock().unwrap();
        b.rate = bytes_per_sec.map(|r| r as f64);
        b.tokens = 0.0;
        b.last = Instant::now();
    }

    /// Cuts the wire: every connection through it is shut down, and new ones are closed.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        for s in self.shared.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Mends the wire: new connections go through again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}
