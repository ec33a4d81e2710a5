//! The one timer of gdx: every measured span that is read either on the host's clock or on
//! the device's, chosen at run time, is a [`Timer`] sample (gdx-bench's cases and examples,
//! gdx-doctor's probes), so "how long did it take" is read one way everywhere.
//!
//! A timer is one of two clocks:
//!
//! - **Wall** ([`Timer::wall`]): the host's monotonic clock, the same clock as
//!   `gdx_base::clock::wall` (which times a closure and needs no vendor library). It is what a
//!   caller waits for: enqueue, synchronisation and wake-ups included.
//! - **Events** ([`Timer::events`]): a pair of CUDA timing events per stream, recorded at
//!   [`Timer::start`] and [`Timer::stop`]; [`Timer::read`] synchronises the streams and gives
//!   the slowest stream's span. The device's own clock (about 0.5 µs resolution): enqueue cost
//!   is left out when the streams are held between start and stop ([`Stream::hold`]).
//!
//! [`CpuClock`] is the process's CPU time (user + system), for CPU seconds per GB moved.
//!
//! It lives here, beside the events it records, so that crates which only time (gdx-nccl,
//! gdx-doctor) need not depend on gdx-bench. Either way a sample is a [`Duration`]; the median,
//! quantiles and σ of samples are `gdx_base::stats`'s, the bandwidth model is
//! `gdx_topo::bandwidth`'s. Deadlines and budgets are not measurements and keep [`Instant`].

use std::time::{Duration, Instant};

use crate::cuda::{CudaError, Event, Stream};

/// A clock that times one span at a time: host wall time or CUDA events on streams.
#[derive(Debug)]
pub struct Timer<'s> {
    clock: Clock<'s>,
}

#[derive(Debug)]
enum Clock<'s> {
    Wall {
        start: Option<Instant>,
        end: Option<Instant>,
    },
    Events {
        streams: Vec<&'s Stream>,
        /// (start, end) per stream, in `streams`' order.
        pairs: Vec<(Event, Event)>,
    },
}

impl Timer<'static> {
    /// A host wall-clock timer.
    pub fn wall() -> Timer<'static> {
        Timer {
            clock: Clock::Wall {
                start: None,
                end: None,
            },
        }
    }
}

impl<'s> Timer<'s> {
    /// A device timer: a pair of timing events for each of `streams` (made in each stream's
    /// context). Fails with no stream, since there would be nothing to time on.
    pub fn events(streams: &[&'s Stream]) -> Result<Timer<'s>, CudaError> {
        if streams.is_empty() {
            return Err(CudaError::InvalidArgument {
                call: "Timer::events",
                reason: "a device timer needs a stream".into(),
            });
        }
        let pairs = streams
            .iter()
            .map(|s| Ok((Event::new(s.context())?, Event::new(s.context())?)))
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(Timer {
            clock: Clock::Events {
                streams: streams.to_vec(),
                pairs,
            },
        })
    }

    /// Whether it reads the device's clock (CUDA events) rather than the host's.
    pub fn on_device(&self) -> bool {
        matches!(self.clock, Clock::Events { .. })
    }

    /// Mark the start: now (wall), or a start event recorded on each stream.
    pub fn start(&mut self) -> Result<(), CudaError> {
        match &mut self.clock {
            Clock::Wall { start, end } => {
                *end = None;
                *start = Some(Instant::now());
            }
            Clock::Events { streams, pairs } => {
                for (s, (start, _)) in streams.iter().zip(pairs.iter()) {
                    start.record(s)?;
                }
            }
        }
        Ok(())
    }

    /// Mark the end: now (wall), or an end event recorded on each stream (nothing waits here,
    /// so a caller may release held streams before [`Timer::read`]).
    pub fn stop(&mut self) -> Result<(), CudaError> {
        match &mut self.clock {
            Clock::Wall { end, .. } => *end = Some(Instant::now()),
            Clock::Events { streams, pairs } => {
                for (s, (_, end)) in streams.iter().zip(pairs.iter()) {
                    end.record(s)?;
                }
            }
        }
        Ok(())
    }

    /// The span from start to stop: wall time (up to now when not stopped), or, after
    /// synchronising every stream, the slowest stream's event time. Zero before a start.
    pub fn read(&self) -> Result<Duration, CudaError> {
        match &self.clock {
            Clock::Wall { start, end } => Ok(match start {
                Some(s) => end
                    .unwrap_or_else(Instant::now)
                    .saturating_duration_since(*s),
                None => Duration::ZERO,
            }),
            Clock::Events { streams, pairs } => {
                for s in streams {
                    s.synchronize()?;
                }
                let mut worst = Duration::ZERO;
                for (start, end) in pairs {
                    worst = worst.max(start.elapsed(end)?);
                }
                Ok(worst)
            }
        }
    }

    /// Time `f`: start, `f`, stop, read. `f`'s error ends it without a sample.
    pub fn time<T, E: From<CudaError>>(
        &mut self,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<(T, Duration), E> {
        self.start()?;
        let v = f()?;
        self.stop()?;
        Ok((v, self.read()?))
    }
}

/// Process CPU time (user + system, all threads) at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock(Option<Duration>);

impl CpuClock {
    /// Read the clock now (`getrusage(RUSAGE_SELF)`); unreadable gives a clock that yields
    /// no figure.
    pub fn now() -> CpuClock {
        CpuClock(crate::os::process_cpu_time().ok())
    }

    /// The clock as if `by` less CPU time had passed since it was read (time spent on work
    /// the figure leaves out).
    pub fn shifted(self, by: Duration) -> CpuClock {
        CpuClock(self.0.map(|t| t + by))
    }

    /// CPU seconds per GB (1e9 bytes) for `bytes` moved since `self`.
    pub fn per_gb_since(self, bytes: f64) -> Option<f64> {
        let (Some(a), Some(b)) = (self.0, CpuClock::now().0) else {
            return None;
        };
        (bytes > 0.0).then(|| b.saturating_sub(a).as_secs_f64() / (bytes / 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_timer_reads_zero_before_start_and_holds_its_stop() {
        let mut t = Timer::wall();
        assert!(!t.on_device());
        assert_eq!(t.read().unwrap(), Duration::ZERO);
        let (v, d) = t.time(|| Ok::<_, CudaError>(3)).unwrap();
        assert_eq!(v, 3);
        assert_eq!(t.read().unwrap(), d, "a stopped timer keeps its span");
    }

    #[test]
    fn an_error_inside_gives_no_sample() {
        let mut t = Timer::wall();
        let r = t.time(|| Err::<(), _>(CudaError::MissingSymbol { call: "x" }));
        assert!(r.is_err());
    }

    #[test]
    fn a_device_timer_needs_a_stream() {
        assert!(Timer::events(&[]).is_err());
    }

    #[test]
    fn cpu_clock_reads() {
        let c = CpuClock::now();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(c.per_gb_since(1e9).is_some());
    }
}
