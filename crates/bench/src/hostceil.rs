//! The host ceiling: the fastest this machine's CPUs copy host memory, measured once per run,
//! so that `%ceil` on host ↔ host rows (memcpy, shm, tcp loopback) means something.
//!
//! One single-thread `memcpy` of 256 MiB (the old ceiling) is neither stable nor an upper
//! bound: it moved 8.8–13.8 GB/s from run to run, and rows whose buffers stay in cache beat it
//! (126 %, 233 %). So the ceiling is the **best** of several working sets × thread counts:
//!
//! - working sets [`WORKING_SETS`] (256 KiB and 8 MiB stay in cache, 256 MiB does not), each
//!   split evenly over 1 and `min(CPUs, 8)` threads, each copying its part repeatedly;
//! - each point is the best of [`BATCHES`] timed batches after one untimed pass;
//! - rows of [`DRAM_FROM_BYTES`] or more are judged against the best 256 MiB figure (DRAM: a
//!   transfer that large cannot stay in cache), smaller rows against the best of every point
//!   (their buffers may be cache-resident).
//!
//! Both figures take the best over threads, so a one-thread row cannot legitimately exceed
//! them; a row that still does (> [`crate::ceiling::OVER_CEILING_PCT`]) is flagged as a wrong
//! ceiling rather than shown as 233 %.

use std::sync::Barrier;
use std::time::Duration;

use gdx_base::clock::{wall_span, Span};

/// Working sets measured (source bytes; the destination is as large).
pub const WORKING_SETS: [u64; 3] = [256 << 10, 8 << 20, 256 << 20];

/// Rows at least this large are judged against the DRAM figure.
pub const DRAM_FROM_BYTES: u64 = 16 << 20;

/// Timed batches per point; the best counts.
pub const BATCHES: usize = 5;

/// Bytes each batch copies at least (repeating the working set), so a cache-resident batch
/// lasts long enough for the clock.
const BATCH_BYTES: u64 = 64 << 20;

/// Most threads tried (more only adds noise on a shared machine).
const MAX_THREADS: usize = 8;

pub use crate::report::{CeilingPoint, HostCeiling};

impl HostCeiling {
    /// A fixed ceiling (the mock backend).
    pub fn fixed(gbps: f64) -> HostCeiling {
        HostCeiling {
            method: "fixed (mock backend)".into(),
            dram_gbps: gbps,
            cache_gbps: gbps,
            points: Vec::new(),
        }
    }

    /// Measure it (about half a second; allocates 512 MiB for the duration).
    pub fn measure() -> HostCeiling {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut threads = vec![1];
        if cpus.min(MAX_THREADS) > 1 {
            threads.push(cpus.min(MAX_THREADS));
        }
        let max = WORKING_SETS.iter().copied().max().unwrap_or(0) as usize;
        let src = vec![0x5au8; max];
        let mut dst = vec![0u8; max];
        let mut points = Vec::new();
        for &ws in &WORKING_SETS {
            for &t in &threads {
                let gbps = best_gbps(&src[..ws as usize], &mut dst[..ws as usize], t);
                points.push(CeilingPoint {
                    working_set_bytes: ws,
                    threads: t,
                    gbps,
                });
            }
        }
        Self::from_points(points, &threads)
    }

    fn from_points(points: Vec<CeilingPoint>, threads: &[usize]) -> HostCeiling {
        let best = |f: &dyn Fn(&CeilingPoint) -> bool| {
            points
                .iter()
                .filter(|p| f(p))
                .map(|p| p.gbps)
                .fold(0.0, f64::max)
        };
        let big = WORKING_SETS.iter().copied().max().unwrap_or(0);
        let dram_gbps = best(&|p| p.working_set_bytes == big);
        let cache_gbps = best(&|_| true);
        let t: Vec<String> = threads.iter().map(ToString::to_string).collect();
        let method = format!(
            "memcpy measured once per run, best of {} thread(s) × working sets 256 KiB, 8 MiB, \
             256 MiB (best of {BATCHES} batches each): {dram_gbps:.1} GB/s with 256 MiB (DRAM) \
             for transfers ≥ 16 MiB, {cache_gbps:.1} GB/s (cache-resident) below",
            t.join(" and ")
        );
        HostCeiling {
            method,
            dram_gbps,
            cache_gbps,
            points,
        }
    }

    /// The ceiling of a row of `size` bytes and what it is based on.
    pub fn for_size(&self, size: u64) -> (f64, String) {
        if size >= DRAM_FROM_BYTES {
            (
                self.dram_gbps,
                "host memcpy best, 256 MiB buffers (DRAM)".into(),
            )
        } else {
            (
                self.cache_gbps,
                "host memcpy best, cache-resident buffers".into(),
            )
        }
    }
}

/// The best of [`BATCHES`] batches copying `src` into `dst` with `threads` threads, each its
/// own slice, GB/s.
///
/// The workers read the clock themselves (a batch lasts from the first worker's start to the
/// last worker's end): a coordinating thread that is descheduled between two barriers on a
/// busy machine would otherwise time nothing and report an absurd figure.
fn best_gbps(src: &[u8], dst: &mut [u8], threads: usize) -> f64 {
    let threads = threads.max(1);
    let chunk = (src.len() / threads).max(1);
    let reps = (BATCH_BYTES / src.len().max(1) as u64).max(1);
    // As many workers as there are chunks (fewer than `threads` only for tiny sets), so the
    // barrier counts exactly the threads that wait on it.
    let workers = src.chunks(chunk).count().min(threads);
    let barrier = Barrier::new(workers);
    let spans: Vec<Vec<Span>> = std::thread::scope(|s| {
        let handles: Vec<_> = src
            .chunks(chunk)
            .zip(dst.chunks_mut(chunk))
            .take(workers)
            .map(|(sc, dc)| {
                let barrier = &barrier;
                s.spawn(move || {
                    // One untimed pass faults the pages in and warms the caches.
                    dc.copy_from_slice(sc);
                    (0..BATCHES)
                        .map(|_| {
                            barrier.wait();
                            wall_span(|| {
                                for _ in 0..reps {
                                    dc.copy_from_slice(std::hint::black_box(sc));
                                    std::hint::black_box(&mut *dc);
                                }
                            })
                            .1
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    if spans.len() != workers {
        return 0.0; // a worker panicked: no figure rather than a wrong one
    }
    let best = (0..BATCHES)
        .filter_map(|b| {
            Span::cover(spans.iter().filter_map(|w| w.get(b)).copied()).map(|s| s.len())
        })
        .min()
        .unwrap_or(Duration::ZERO);
    if best.is_zero() {
        return 0.0;
    }
    let bytes = src.len().min(chunk * workers) as f64 * reps as f64;
    bytes / best.as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dram_figure_judges_large_rows_and_the_best_judges_small_ones() {
        let pts = vec![
            CeilingPoint {
                working_set_bytes: 256 << 10,
                threads: 1,
                gbps: 40.0,
            },
            CeilingPoint {
                working_set_bytes: 256 << 20,
                threads: 1,
                gbps: 9.0,
            },
            CeilingPoint {
                working_set_bytes: 256 << 20,
                threads: 2,
                gbps: 14.0,
            },
        ];
        let c = HostCeiling::from_points(pts, &[1, 2]);
        assert_eq!(c.dram_gbps, 14.0);
        assert_eq!(c.cache_gbps, 40.0);
        assert_eq!(c.for_size(1 << 30).0, 14.0);
        assert_eq!(c.for_size(4096).0, 40.0);
        assert!(c.method.contains("1 and 2 thread"), "{}", c.method);
    }

    #[test]
    fn a_batch_copies_and_yields_a_figure() {
        let src = vec![7u8; 1 << 20];
        let mut dst = vec![0u8; 1 << 20];
        assert!(best_gbps(&src, &mut dst, 2) > 0.0);
        assert!(dst.iter().all(|&b| b == 7), "both halves were copied");
    }
}
