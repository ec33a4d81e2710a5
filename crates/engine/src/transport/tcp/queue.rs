//! A data stream's job queue: jobs and a doorbell (a unix socket pair the idle stream thread
//! waits on in `poll`, with a short timeout so a missed ring costs at most one nap).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};

/// Longest idle `poll` before the thread looks at its queue again.
const NAP: Duration = Duration::from_millis(20);

/// Jobs for one stream's thread.
#[derive(Debug)]
pub(super) struct JobQueue<J> {
    q: Mutex<(VecDeque<J>, bool)>,
    bell: UnixStream,
    bell_rx: UnixStream,
}

impl<J> JobQueue<J> {
    pub(super) fn new() -> Result<Self> {
        let (bell, bell_rx) = UnixStream::pair().map_err(|e| Error::os("socketpair", e))?;
        bell.set_nonblocking(true)
            .and_then(|()| bell_rx.set_nonblocking(true))
            .map_err(|e| Error::os("socketpair", e))?;
        Ok(JobQueue {
            q: Mutex::new((VecDeque::new(), false)),
            bell,
            bell_rx,
        })
    }

    /// Queues `job`; `ring` wakes the thread now (a job it must start), otherwise the job waits
    /// for the stream's input or the nap. Gives the job back once the queue is closed.
    pub(super) fn push(&self, job: J, ring: bool) -> std::result::Result<(), J> {
        let mut g = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if g.1 {
            return Err(job);
        }
        g.0.push_back(job);
        drop(g);
        if ring {
            // A full doorbell already wakes the thread: a failed write loses nothing.
            let _ = (&self.bell).write(&[1]);
        }
        Ok(())
    }

    /// The next job; `None` with `true` once the queue is closed and empty.
    pub(super) fn pop(&self) -> (Option<J>, bool) {
        let mut g = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let j = g.0.pop_front();
        let closed = g.1 && j.is_none();
        (j, closed)
    }

    /// Stops accepting jobs (the thread ends after the queued ones) and wakes the thread.
    pub(super) fn close(&self) {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        let _ = (&self.bell).write(&[1]);
    }

    /// Waits (at most `NAP`) for the doorbell.
    pub(super) fn idle_wait(&self) {
        let mut fds = [rustix::event::PollFd::new(
            &self.bell_rx,
            rustix::event::PollFlags::IN,
        )];
        let nap = rustix::event::Timespec {
            tv_sec: NAP.as_secs().try_into().unwrap_or(0),
            tv_nsec: NAP.subsec_nanos().into(),
        };
        let n = rustix::event::poll(&mut fds, Some(&nap)).unwrap_or(0);
        if n > 0 {
            let mut sink = [0u8; 64];
            while matches!((&self.bell_rx).read(&mut sink), Ok(k) if k > 0) {}
        }
    }
}
