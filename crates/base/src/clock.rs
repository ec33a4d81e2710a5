//! The host's wall clock, for every span gdx measures on the host: [`wall`] times a closure,
//! [`wall_span`] keeps the span's ends so spans of several threads can be joined on one clock
//! ([`Span::cover`]). It is the monotonic clock (`Instant`): what a caller waits for, enqueue,
//! synchronisation and wake-ups included.
//!
//! A timer that reads either this clock or CUDA events on streams, chosen at run time, is
//! `gdx_sys::timer::Timer` (the events are a vendor library's). Deadlines and budgets (how
//! long to keep trying) are not measurements and keep [`Instant`].

use std::time::{Duration, Instant};

/// A wall-clock span with its ends, for spans of several threads that are joined on one clock
/// (the earliest start to the latest end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// When it began.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
}

impl Span {
    /// Its length.
    pub fn len(&self) -> Duration {
        self.end.saturating_duration_since(self.start)
    }

    /// The span from the earliest start to the latest end of `spans`; `None` when empty.
    pub fn cover(spans: impl IntoIterator<Item = Span>) -> Option<Span> {
        spans.into_iter().reduce(|a, b| Span {
            start: a.start.min(b.start),
            end: a.end.max(b.end),
        })
    }
}

/// Time `f` on the host's monotonic clock.
pub fn wall<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let (v, s) = wall_span(f);
    (v, s.len())
}

/// Time `f` on the host's monotonic clock, keeping the span's ends.
pub fn wall_span<T>(f: impl FnOnce() -> T) -> (T, Span) {
    let start = Instant::now();
    let v = f();
    let end = Instant::now();
    (v, Span { start, end })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_spans_are_ordered_and_cover_their_parts() {
        let (v, a) = wall_span(|| 7);
        assert_eq!(v, 7);
        let (_, b) = wall_span(|| ());
        assert!(a.end <= b.start);
        let c = Span::cover([b, a]).unwrap();
        assert_eq!((c.start, c.end), (a.start, b.end));
        assert!(c.len() >= a.len());
        assert_eq!(Span::cover([]), None);
    }

    #[test]
    fn wall_returns_the_value_and_the_span_length() {
        let (v, d) = wall(|| "x");
        assert_eq!(v, "x");
        assert!(d < Duration::from_secs(60));
    }
}
