//! The inbound notification queue, bounded in count and bytes.
//!
//! A sender that finds it full waits (back-pressure on its connection: its next frame is not
//! read) for up to half the I/O timeout, then gets [`Error::LimitReached`]; nothing queued is ever
//! dropped to make room, so a notification acknowledged with `Ok` is one the application sees.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::limits::LimitHits;

/// Largest notification a sender may send (a transfer's, or [`crate::Peer::notify`]'s): checked
/// before anything is sent, so an oversized one is refused locally instead of making the peer
/// close the connection.
pub const MAX_NOTIFICATION_BYTES: usize = 64 << 10;

/// Refuses a notification of `len` bytes over [`MAX_NOTIFICATION_BYTES`].
///
/// # Errors
/// [`Error::InvalidArgument`] naming both sizes.
pub(crate) fn check_size(len: usize) -> Result<()> {
    if len > MAX_NOTIFICATION_BYTES {
        return Err(Error::InvalidArgument(format!(
            "notification of {len} bytes is larger than {MAX_NOTIFICATION_BYTES} \
             (MAX_NOTIFICATION_BYTES); send bulk data as a transfer and notify with a short message"
        )));
    }
    Ok(())
}

/// A small message a peer delivered after a transfer's data was in place (or sent on its own with
/// [`crate::Peer::notify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Name of the sending agent.
    pub from: String,
    /// The sender's transfer id (0 for a standalone notification).
    pub xfer: u64,
    /// The message.
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    q: VecDeque<Notification>,
    bytes: usize,
}

/// Bounded FIFO of notifications.
#[derive(Debug)]
pub(crate) struct NotificationQueue {
    st: Mutex<State>,
    ready: Condvar,
    room: Condvar,
    max_count: usize,
    max_bytes: usize,
}

impl NotificationQueue {
    pub(crate) fn new(max_count: usize, max_bytes: usize) -> Self {
        NotificationQueue {
            st: Mutex::new(State::default()),
            ready: Condvar::new(),
            room: Condvar::new(),
            max_count,
            max_bytes,
        }
    }

    /// Queues `n`, waiting up to `wait` for room.
    pub(crate) fn push(&self, n: Notification, wait: Duration, hits: &LimitHits) -> Result<()> {
        let size = n.data.len();
        if size > self.max_bytes {
            hits.hit(
                &hits.notifications,
                "a notification larger than max_queued_notification_bytes",
            );
            return Err(Error::LimitReached {
                what: "notification larger than max_queued_notification_bytes".into(),
                limit: self.max_bytes as u64,
            });
        }
        let deadline = Instant::now() + wait;
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        while st.q.len() >= self.max_count || st.bytes + size > self.max_bytes {
            let now = Instant::now();
            if now >= deadline {
                let what = format!(
                    "notification queue full ({} queued, {} bytes; max_queued_notifications {}, \
                     max_queued_notification_bytes {}): the application is not taking them",
                    st.q.len(),
                    st.bytes,
                    self.max_count,
                    self.max_bytes
                );
                drop(st);
                hits.hit(&hits.notifications, &what);
                return Err(Error::LimitReached {
                    what,
                    limit: self.max_count as u64,
                });
            }
            st = self
                .room
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.bytes += size;
        st.q.push_back(n);
        drop(st);
        self.ready.notify_all();
        Ok(())
    }

    fn take(&self, st: &mut State) -> Option<Notification> {
        let n = st.q.pop_front()?;
        st.bytes -= n.data.len();
        self.room.notify_all();
        Some(n)
    }

    pub(crate) fn pop(&self, timeout: Duration) -> Result<Notification> {
        crate::accepted::pop_timed(&self.st, &self.ready, timeout, |st| self.take(st))
    }

    pub(crate) fn try_pop(&self) -> Option<Notification> {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        self.take(&mut st)
    }
}
