//! The transfer clock: raw counter ticks, read at a transfer's start and end and by the shm
//! ring's doorbell check, and turned into time only where a duration is reported or compared.
//!
//! Why raw ticks: a scaled read (`quanta::Instant::now`, or `std::time::Instant::now` through
//! the vDSO) costs 30–35 ns on this project's 2-vCPU VMs, a raw one (`quanta::Clock::raw`: the
//! TSC where quanta judged it usable, else the OS monotonic clock in ns) about 13 ns, and a
//! small shm transfer reads the clock three times within a round trip of a few hundred ns.
//! Scaling is linear (`delta_as_nanos`), so a duration becomes ticks with one factor taken
//! once per process.

use std::sync::OnceLock;
use std::time::Duration;

/// The process's clock and its ticks per nanosecond.
struct Source {
    clock: quanta::Clock,
    ticks_per_ns: f64,
}

static SOURCE: OnceLock<Source> = OnceLock::new();

fn source() -> &'static Source {
    SOURCE.get_or_init(|| {
        let clock = quanta::Clock::new();
        // Any span gives the factor (the scaling has no offset); a large one keeps it exact.
        const SPAN: u64 = 1 << 40;
        let ns = clock.delta_as_nanos(0, SPAN).max(1);
        Source {
            clock,
            ticks_per_ns: SPAN as f64 / ns as f64,
        }
    })
}

/// A duration in ticks of the transfer clock ([`Tick::span`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span(u64);

/// A reading of the transfer clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Tick(u64);

impl Tick {
    /// Now.
    pub(crate) fn now() -> Tick {
        Tick(source().clock.raw())
    }

    /// Time from `earlier` to this reading (zero if `earlier` is not earlier).
    pub(crate) fn since(self, earlier: Tick) -> Duration {
        source().clock.delta(earlier.0, self.0)
    }

    /// Nanoseconds from `earlier` to this reading (zero if `earlier` is not earlier), as a
    /// plain integer: what a transfer's end stores and counts, with no `Duration` made.
    pub(crate) fn nanos_since(self, earlier: Tick) -> u64 {
        if self.0 <= earlier.0 {
            return 0;
        }
        source().clock.delta_as_nanos(earlier.0, self.0)
    }

    /// This reading plus `d`, saturating: a `d` too long for the clock (`Duration::MAX` for
    /// "never") gives the last tick, which no reading reaches.
    pub(crate) fn plus(self, d: Duration) -> Tick {
        // f64 to u64 saturates (and NaN gives 0, which `max(1)` above rules out). The
        // nanoseconds go through u64 (saturating: "never" stays never), not u128, whose
        // conversion to f64 is a library call on every transfer's deadline.
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let ticks = (ns as f64 * source().ticks_per_ns) as u64;
        Tick(self.0.saturating_add(ticks))
    }

    /// Whether this reading is less than `span` after `earlier` (`span` from [`Tick::span`]):
    /// a comparison of raw ticks, with no scaling, for checks made once per post.
    pub(crate) fn within(self, earlier: Tick, span: Span) -> bool {
        self.0 >= earlier.0 && self.0 - earlier.0 < span.0
    }

    /// `d` in ticks of this clock, for [`Tick::within`] (taken once, not per check).
    pub(crate) fn span(d: Duration) -> Span {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Span((ns as f64 * source().ticks_per_ns) as u64)
    }

    /// Time from now until this reading (zero once it passed).
    pub(crate) fn left(self) -> Duration {
        self.since(Tick::now())
    }
}

/// Sets the clock up (quanta calibrates its counter) before the first transfer reads it.
pub(crate) fn warm() {
    let _ = Tick::now();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_measure_time_and_deadlines_saturate() {
        let a = Tick::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = Tick::now();
        let d = b.since(a);
        assert!(
            d >= Duration::from_millis(19) && d < Duration::from_secs(5),
            "{d:?}"
        );
        assert_eq!(a.since(b), Duration::ZERO, "backwards is zero");
        let later = a.plus(Duration::from_millis(500));
        let span = later.since(a);
        assert!(
            span > Duration::from_millis(499) && span < Duration::from_millis(501),
            "{span:?}"
        );
        assert!(later > b);
        let never = b.plus(Duration::MAX);
        assert_eq!(never, Tick(u64::MAX));
        assert!(never.left() > Duration::from_secs(1 << 30));
        assert_eq!(a.left(), Duration::ZERO);
    }

    #[test]
    fn within_compares_raw_ticks_against_a_span() {
        let a = Tick::now();
        let half = Tick::span(Duration::from_millis(500));
        assert!(a.plus(Duration::from_millis(100)).within(a, half));
        assert!(!a.plus(Duration::from_millis(600)).within(a, half));
        assert!(a.within(a, half), "no time at all is within");
        assert!(
            !a.within(a.plus(Duration::from_millis(1)), half),
            "earlier is not within"
        );
    }
}
