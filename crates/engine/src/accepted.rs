//! The agent's list of peers that connected to it ([`crate::Agent::accept`]): a bounded FIFO
//! with a blocking, timed pop.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A FIFO with a blocking, timed pop.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    q: Mutex<VecDeque<T>>,
    cv: Condvar,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            q: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
        }
    }
}

impl<T> Queue<T> {
    pub(crate) fn push(&self, v: T) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= 1024 {
            // Bounded: only authenticated peers are announced, and this list is informational
            // (Agent::accept), so the oldest entry gives way.
            q.pop_front();
        }
        q.push_back(v);
        drop(q);
        self.cv.notify_all();
    }

    pub(crate) fn pop(&self, timeout: Duration) -> Result<T> {
        pop_timed(&self.q, &self.cv, timeout, VecDeque::pop_front)
    }
}

/// Waits up to `timeout` on `cv` for `take` to find something in `m`'s state (each wake-up
/// tries again): the timed pop of this queue and of the notification queue (`NotificationQueue`).
pub(crate) fn pop_timed<S, T>(
    m: &Mutex<S>,
    cv: &Condvar,
    timeout: Duration,
    mut take: impl FnMut(&mut S) -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut st = m.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(v) = take(&mut st) {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout(timeout));
        }
        st = cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
