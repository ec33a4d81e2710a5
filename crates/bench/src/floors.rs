//! Latency floors: the round trips a host transport cannot beat on this machine, measured by gdx
//! itself in the same run as the rows they are shown beside (the way the host ceiling is shown
//! beside bandwidth rows), so "8 B shm p50 2.1 µs = 2.5× the shm floor" compares figures taken
//! under the same load.
//!
//! - shm flag: two threads bounce a value through one shared atomic word (spin, yielding every
//!   64 polls, as a shared-memory doorbell does), the physical floor of any shm protocol;
//! - unix socket: 8 bytes echoed over a `socketpair`-style unix stream;
//! - tcp: 8 bytes echoed over a loopback TCP connection with `TCP_NODELAY`.
//!
//! Each is the median of [`ROUND_TRIPS`] timed round trips after a warm-up; a floor that could
//! not be measured (no loopback) is `None`, never a guess.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::case::PathKind;
use crate::report::Row;

/// Timed round trips per floor.
pub const ROUND_TRIPS: usize = 20_000;
const WARMUP: usize = 2_000;

/// The floors of one run, p50 round trip in µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyFloors {
    /// Shared-memory flag round trip.
    pub shm_flag_us: f64,
    /// Unix-socket 8-byte round trip.
    pub unix_us: Option<f64>,
    /// TCP loopback 8-byte round trip (`TCP_NODELAY`).
    pub tcp_us: Option<f64>,
    /// How they were measured, in words.
    pub method: String,
}

impl LatencyFloors {
    /// Measures all three (about a second on an idle machine).
    pub fn measure() -> LatencyFloors {
        LatencyFloors {
            shm_flag_us: shm_flag(),
            unix_us: unix().ok(),
            tcp_us: tcp().ok(),
            method: format!(
                "p50 of {ROUND_TRIPS} round trips between two threads after {WARMUP} warm-up: \
                 shm flag (one atomic word, spin + yield), unix socket and tcp loopback \
                 (TCP_NODELAY) echoing 8 B"
            ),
        }
    }

    /// The header line.
    pub fn summary(&self) -> String {
        let f = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2} µs"));
        format!(
            "latency floors (same run): shm flag {:.2} µs, unix socket {}, tcp loopback {}",
            self.shm_flag_us,
            f(self.unix_us),
            f(self.tcp_us)
        )
    }

    /// One line per small shm/tcp row with a p50: the row against its floor.
    pub fn beside(&self, rows: &[&Row]) -> String {
        let mut s = String::new();
        for r in rows {
            let (Some(p50), true) = (r.lat_p50_us, r.size_bytes <= 64 << 10) else {
                continue;
            };
            // A p50 of a whole window (`--batch`/`--window`) is not one round trip.
            if r.note
                .as_deref()
                .is_some_and(|n| n.contains(crate::host::WINDOW_NOTE))
            {
                continue;
            }
            let size = crate::render::human_size(r.size_bytes);
            match r.path {
                PathKind::Shm => {
                    s.push_str(&format!(
                        "{size} shm p50 {p50:.2} µs = {:.1}× the shm floor",
                        p50 / self.shm_flag_us.max(1e-9)
                    ));
                    if let Some(u) = self.unix_us {
                        s.push_str(&format!(", {:.2}× the unix-socket floor", p50 / u));
                    }
                    s.push('\n');
                }
                PathKind::Tcp => {
                    if let Some(t) = self.tcp_us {
                        s.push_str(&format!(
                            "{size} tcp p50 {p50:.2} µs = {:.2}× the tcp floor\n",
                            p50 / t
                        ));
                    }
                }
                _ => {}
            }
        }
        s
    }
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn spin_until(w: &AtomicU32, want: u32) {
    let mut i = 0u32;
    while w.load(Ordering::Acquire) != want {
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn shm_flag() -> f64 {
    let w = Arc::new(AtomicU32::new(0));
    let n = (WARMUP + ROUND_TRIPS) as u32;
    let w2 = Arc::clone(&w);
    let echo = std::thread::spawn(move || {
        for i in 0..n {
            spin_until(&w2, 2 * i + 1);
            w2.store(2 * i + 2, Ordering::Release);
        }
    });
    let mut t = Vec::with_capacity(ROUND_TRIPS);
    for i in 0..n {
        let s = Instant::now();
        w.store(2 * i + 1, Ordering::Release);
        spin_until(&w, 2 * i + 2);
        if i as usize >= WARMUP {
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
    }
    let _ = echo.join();
    p50(t)
}

fn ping_pong<S: Read + Write + Send + 'static>(mut a: S, mut b: S) -> std::io::Result<f64> {
    let n = WARMUP + ROUND_TRIPS;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 8];
        for _ in 0..n {
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
        }
        Ok(())
    });
    let mut t = Vec::with_capacity(ROUND_TRIPS);
    let mut buf = [7u8; 8];
    for i in 0..n {
        let s = Instant::now();
        a.write_all(&buf)?;
        a.read_exact(&mut buf)?;
        if i >= WARMUP {
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.join()
        .map_err(|_| std::io::Error::other("echo thread panicked"))??;
    Ok(p50(t))
}

fn unix() -> std::io::Result<f64> {
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    ping_pong(a, b)
}

fn tcp() -> std::io::Result<f64> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let a = std::net::TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    ping_pong(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_are_measured_and_rows_are_set_beside_them() {
        let f = LatencyFloors::measure();
        assert!(f.shm_flag_us > 0.0 && f.unix_us.is_some() && f.tcp_us.is_some());
        assert!(f.summary().contains("shm flag"));
        let fixed = LatencyFloors {
            shm_flag_us: 1.0,
            unix_us: Some(10.0),
            tcp_us: Some(20.0),
            method: String::new(),
        };
        let cases = crate::host::cases();
        let mut row = Row::new(cases[0].spec(), 8);
        row.path = PathKind::Shm;
        row.size_bytes = 8;
        row.lat_p50_us = Some(2.5);
        let mut big = row.clone();
        big.size_bytes = 1 << 30;
        let mut t = row.clone();
        t.path = PathKind::Tcp;
        t.lat_p50_us = Some(24.0);
        let mut windowed = row.clone();
        windowed.add_note(format!("p50 per {}", crate::host::WINDOW_NOTE));
        let s = fixed.beside(&[&row, &big, &t, &windowed]);
        assert_eq!(
            s,
            "8 B shm p50 2.50 µs = 2.5× the shm floor, 0.25× the unix-socket floor\n\
             8 B tcp p50 24.00 µs = 1.20× the tcp floor\n"
        );
    }
}
