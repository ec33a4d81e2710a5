//! Latency floors: the round trips a host transport cannot beat on this machine, measured by gdx
//! itself in the same run as the rows they are shown beside (the way the host ceiling is shown
//! beside bandwidth rows), so "8 B shm p50 2.1 µs = 2.5× the shm floor" compares figures taken
//! under the same load.
//!
//! - shm flag: two threads bounce a value through one shared atomic word (spin, yielding every
//!   64 polls, as a shared-memory doorbell does), the physical floor of any shm protocol; the
//!   echo thread leaves the initiator's CPU when it starts there (`gdx_engine::leave_cpu`), as
//!   the engine's ring thread does: two spinners on one CPU measure context switches, and a
//!   floor of several µs beside a 0.4 µs transfer flattered it (one `gdx bench` run in about
//!   twelve on a 2-vCPU VM);
//! - unix socket: 8 bytes echoed over a `socketpair`-style unix stream;
//! - tcp: 8 bytes echoed over a loopback TCP connection with `TCP_NODELAY`.
//!
//! Each is the median of [`ROUND_TRIPS`] timed round trips after a warm-up; a floor that could
//! not be measured (no loopback) is `None`, never a guess.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::case::PathKind;
use crate::report::Row;
use gdx_base::clock::wall;
use gdx_base::stats::median;

/// How far apart the floor measured beside a row and the run's floor may be before the row's
/// line says the floor moved.
const FLOOR_MOVED: f64 = 1.5;

/// Timed round trips per floor.
pub const ROUND_TRIPS: usize = 20_000;
/// Untimed round trips before the run-wide floors (and warm-up transfers of small host rows).
pub(crate) const WARMUP: usize = 2_000;

pub use crate::report::{LatencyFloors, NearFloor};

impl LatencyFloors {
    /// Measures all three (about a second on an idle machine).
    pub fn measure() -> LatencyFloors {
        LatencyFloors {
            shm_flag_us: shm_flag(),
            unix_us: unix().ok(),
            tcp_us: tcp().ok(),
            method: format!(
                "p50 of {ROUND_TRIPS} round trips between two threads after {WARMUP} warm-up: \
                 shm flag (one atomic word, spin + yield; the two threads on two CPUs when \
                 two are allowed), unix socket and tcp loopback (TCP_NODELAY) echoing 8 B"
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
                .is_some_and(|n| n.contains(crate::report::WINDOW_NOTE))
            {
                continue;
            }
            let size = gdx_base::bytesize::human_bytes(r.size_bytes);
            if let Some(n) = &r.floor_near {
                let (what, run) = match r.path {
                    PathKind::Tcp => ("tcp", self.tcp_us),
                    _ => ("shm", Some(self.shm_flag_us)),
                };
                s.push_str(&format!(
                    "{size} {what} p50 {p50:.2} µs = {:.2}× the {what} floor measured beside it \
                     ({:.2} µs; {} block(s) interleaved, {:.2}–{:.2}×)",
                    n.ratio, n.floor_us, n.blocks, n.ratio_min, n.ratio_max
                ));
                if let Some(f) = run {
                    s.push_str(&format!("; {:.2}× the run's floor", p50 / f.max(1e-9)));
                    // The two floors disagree when the machine changed under the run: on a
                    // small VM the host places its vCPUs on one core's hyperthreads (a
                    // 0.07 µs shm floor), on nearby cores (0.12 µs) or far apart (0.4 µs),
                    // and the ratio moves with it; said, so a reader does not take one
                    // placement's figure for another's.
                    if n.floor_us > FLOOR_MOVED * f || f > FLOOR_MOVED * n.floor_us {
                        s.push_str(&format!(
                            " (the floor moved: {:.2} µs beside the row, {:.2} µs at the run's \
                             start; the CPUs' placement changed between them)",
                            n.floor_us, f
                        ));
                    }
                }
                if let (PathKind::Shm, Some(u)) = (r.path, self.unix_us) {
                    s.push_str(&format!(", {:.2}× the unix-socket floor", p50 / u));
                }
                s.push('\n');
                continue;
            }
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
    shm_flag_n(WARMUP, ROUND_TRIPS)
}

fn shm_flag_n(warmup: usize, trips: usize) -> f64 {
    let w = Arc::new(AtomicU32::new(0));
    let n = (warmup + trips) as u32;
    let w2 = Arc::clone(&w);
    let initiator = gdx_engine::current_cpu();
    let echo = std::thread::spawn(move || {
        // A new thread may start on its parent's CPU, where each round trip would wait for
        // the other to yield.
        let _ = gdx_engine::leave_cpu(initiator);
        for i in 0..n {
            spin_until(&w2, 2 * i + 1);
            w2.store(2 * i + 2, Ordering::Release);
        }
    });
    let mut t = Vec::with_capacity(trips);
    for i in 0..n {
        let ((), d) = wall(|| {
            w.store(2 * i + 1, Ordering::Release);
            spin_until(&w, 2 * i + 2);
        });
        if i as usize >= warmup {
            t.push(d.as_secs_f64() * 1e6);
        }
    }
    let _ = echo.join();
    median(&t).unwrap_or(0.0)
}

fn ping_pong<S: Read + Write + Send + 'static>(a: S, b: S) -> std::io::Result<f64> {
    ping_pong_n(a, b, WARMUP, ROUND_TRIPS)
}

fn ping_pong_n<S: Read + Write + Send + 'static>(
    mut a: S,
    mut b: S,
    warmup: usize,
    trips: usize,
) -> std::io::Result<f64> {
    let n = warmup + trips;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 8];
        for _ in 0..n {
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
        }
        Ok(())
    });
    let mut t = Vec::with_capacity(trips);
    let mut buf = [7u8; 8];
    for i in 0..n {
        let (done, d) = wall(|| -> std::io::Result<()> {
            a.write_all(&buf)?;
            a.read_exact(&mut buf)
        });
        done?;
        if i >= warmup {
            t.push(d.as_secs_f64() * 1e6);
        }
    }
    echo.join()
        .map_err(|_| std::io::Error::other("echo thread panicked"))??;
    Ok(median(&t).unwrap_or(0.0))
}

fn unix() -> std::io::Result<f64> {
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    ping_pong(a, b)
}

fn tcp() -> std::io::Result<f64> {
    let (a, b) = tcp_pair()?;
    ping_pong(a, b)
}

fn tcp_pair() -> std::io::Result<(std::net::TcpStream, std::net::TcpStream)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let a = std::net::TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

/// Transfers of a host latency row between two floor blocks ([`NearFloor`]).
pub const BLOCK_OPS: u64 = 100;
/// Timed round trips of one floor block (after `BLOCK_TRIPS / 10` warm-up).
pub const BLOCK_TRIPS: usize = 300;
/// The pause before a floor block: longer than the engine's target spins after its last
/// request (200 µs), so the floor's two threads do not share the cores with it.
const QUIET: std::time::Duration = std::time::Duration::from_micros(400);

/// Which floor a row is judged against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorKind {
    /// Shared-memory flag round trip.
    ShmFlag,
    /// TCP loopback round trip.
    Tcp,
}

impl FloorKind {
    /// The floor of rows of `path`, if it has one.
    pub fn of(path: PathKind) -> Option<FloorKind> {
        match path {
            PathKind::Shm => Some(FloorKind::ShmFlag),
            PathKind::Tcp => Some(FloorKind::Tcp),
            _ => None,
        }
    }

    /// One floor block's p50 in µs, after a pause ([`QUIET`]); `None` if it could not be
    /// measured (no loopback).
    pub fn block(self) -> Option<f64> {
        std::thread::sleep(QUIET);
        let warm = BLOCK_TRIPS / 10;
        match self {
            FloorKind::ShmFlag => Some(shm_flag_n(warm, BLOCK_TRIPS)),
            FloorKind::Tcp => tcp_pair()
                .and_then(|(a, b)| ping_pong_n(a, b, warm, BLOCK_TRIPS))
                .ok(),
        }
    }
}

impl NearFloor {
    /// Pairs `floors[i]` (µs) with the p50 of the `i`-th block of [`BLOCK_OPS`] samples; a
    /// block with too few samples (under a fifth of a block) or no floor is left out.
    pub fn pair(floors: &[Option<f64>], samples: &[std::time::Duration]) -> Option<NearFloor> {
        let mut fl = Vec::new();
        let mut ratios = Vec::new();
        for (f, block) in floors.iter().zip(samples.chunks(BLOCK_OPS as usize)) {
            let (Some(f), true) = (f, block.len() as u64 >= BLOCK_OPS / 5) else {
                continue;
            };
            let us: Vec<f64> = block.iter().map(|d| d.as_secs_f64() * 1e6).collect();
            let us = median(&us).unwrap_or(0.0);
            if *f > 0.0 {
                fl.push(*f);
                ratios.push(us / f);
            }
        }
        if ratios.is_empty() {
            return None;
        }
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
        Some(NearFloor {
            floor_us: median(&fl).unwrap_or(0.0),
            blocks: ratios.len() as u32,
            ratio: median(&ratios).unwrap_or(0.0),
            ratio_min: lo,
            ratio_max: hi,
        })
    }
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

    /// Each block is judged against the floor measured just before it; a block with no floor,
    /// or too few samples, is left out; the median of an even count is the middle pair's mean.
    #[test]
    fn interleaved_blocks_are_paired_with_the_floor_before_them() {
        use std::time::Duration;
        let us = |v: f64, n: usize| vec![Duration::from_secs_f64(v * 1e-6); n];
        let b = BLOCK_OPS as usize;
        // Four blocks: 1 µs over a 0.25 µs floor, 2 µs over 0.5 µs, 100 µs (a time-shared
        // phase) over 10 µs, and a block without a floor; then a 3-sample tail, left out.
        let mut samples = us(1.0, b);
        samples.extend(us(2.0, b));
        samples.extend(us(100.0, b));
        samples.extend(us(5.0, b));
        samples.extend(us(9.0, 3));
        let floors = [Some(0.25), Some(0.5), Some(10.0), None, Some(1.0)];
        let n = NearFloor::pair(&floors, &samples).expect("paired");
        assert_eq!(n.blocks, 3);
        assert!((n.ratio - 4.0).abs() < 1e-9, "{n:?}");
        assert!((n.ratio_min - 4.0).abs() < 1e-9 && (n.ratio_max - 10.0).abs() < 1e-9);
        assert!((n.floor_us - 0.5).abs() < 1e-9);
        assert_eq!(NearFloor::pair(&[None], &samples), None);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));

        let fixed = LatencyFloors {
            shm_flag_us: 0.1,
            unix_us: Some(10.0),
            tcp_us: Some(20.0),
            method: String::new(),
        };
        let mut row = Row::new(crate::host::cases()[0].spec(), 8);
        row.path = PathKind::Shm;
        row.lat_p50_us = Some(1.0);
        row.floor_near = Some(n);
        assert_eq!(
            fixed.beside(&[&row]),
            "8 B shm p50 1.00 µs = 4.00× the shm floor measured beside it (0.50 µs; 3 block(s) \
             interleaved, 4.00–10.00×); 10.00× the run's floor (the floor moved: 0.50 µs beside \
             the row, 0.10 µs at the run's start; the CPUs' placement changed between them), \
             0.10× the unix-socket floor\n"
        );
        // Floors within 1.5× of each other: nothing said.
        let steady = LatencyFloors {
            shm_flag_us: 0.4,
            ..fixed.clone()
        };
        assert_eq!(
            steady.beside(&[&row]),
            "8 B shm p50 1.00 µs = 4.00× the shm floor measured beside it (0.50 µs; 3 block(s) \
             interleaved, 4.00–10.00×); 2.50× the run's floor, 0.10× the unix-socket floor\n"
        );
        // A block of the real floor measures something.
        assert!(FloorKind::ShmFlag.block().is_some_and(|f| f > 0.0));
    }
}
