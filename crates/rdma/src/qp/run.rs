//! [`Qp::run`]: a stream of work items kept in flight within what the device, the queues and
//! a byte budget allow, waited for by progress rather than by a deadline.
//!
//! Why bounded: posting every free send slot at once (2 QPs x 256 slots of 1 MiB = 512 MiB)
//! puts more in flight than a slow or software device (Soft-RoCE) retires before the wait
//! runs out, so a run that was merely slow read as a stall. Why small tickets: the completion
//! queue reports a batch when all of its requests are done, so one batch of hundreds of
//! requests shows no progress until its last byte lands.

use super::{Qp, WorkItem};
use crate::cq::Ticket;
use crate::error::RdmaError;
use gdx_sys::verbs::RdmaOp;
use std::time::{Duration, Instant};

/// Work requests per posted batch: small enough that completions show progress often, large
/// enough that posting costs little per request.
const TICKET_WRS: usize = 64;

impl Qp {
    /// Post `items` in batches that fit the send queues and the in-flight byte budget
    /// ([`crate::EndpointConfig::max_inflight_bytes`]) and wait for all of them; returns the
    /// bytes moved, or the first error (the cause rather than the flushes it triggers).
    /// Items of any size are cut into chunks first, so the queues stay full and never
    /// overflow.
    ///
    /// `timeout` bounds the wait for *progress*: the run fails with [`RdmaError::Timeout`]
    /// when no batch completes for that long, naming each queue pair's state and the port's,
    /// so a slow device finishes and a dead peer or link fails, never hangs.
    pub fn run(
        &mut self,
        op: RdmaOp,
        items: &[WorkItem<'_>],
        timeout: Duration,
    ) -> Result<u64, RdmaError> {
        let mut pieces: Vec<WorkItem<'_>> = Vec::new();
        for it in items {
            let mut off = 0;
            while off < it.len {
                let len = (it.len - off).min(self.chunk);
                pieces.push(WorkItem {
                    local: it.local,
                    local_addr: it.local_addr + off,
                    remote_addr: it.remote_addr.wrapping_add(off),
                    rkey: it.rkey,
                    len,
                });
                off += len;
            }
            if it.len == 0 {
                pieces.push(it.clone()); // refused by `post` with a clear error
            }
        }
        let budget = self.ep.config().max_inflight_bytes.max(1);
        let mut bytes = 0;
        let mut next = 0;
        let mut inflight = 0u64;
        // Open batches of this run with their bytes.
        let mut open: Vec<(Ticket, u64)> = Vec::new();
        // Batches of other connections sharing the completion queue, handed back at the end.
        let mut foreign = Vec::new();
        let mut progress = Instant::now();
        let result = 'run: loop {
            if next >= pieces.len() && open.is_empty() {
                break Ok(bytes);
            }
            // Fill: batches of at most TICKET_WRS requests while slots and budget last; one
            // piece always goes when nothing of this run is in flight, whatever its size.
            while next < pieces.len() {
                let slots = self.free_slots().min(TICKET_WRS);
                let (mut n, mut b) = (0, 0u64);
                while next + n < pieces.len() && n < slots {
                    let len = pieces[next + n].len;
                    if inflight + b + len > budget && inflight + b > 0 {
                        break;
                    }
                    b += len;
                    n += 1;
                }
                if n == 0 {
                    break;
                }
                match self.post(op, &pieces[next..next + n]) {
                    Ok(t) => open.push((t, b)),
                    Err(e) => break 'run Err(e),
                }
                inflight += b;
                next += n;
            }
            let left = timeout.saturating_sub(progress.elapsed());
            let done = match self.cq.poll(left) {
                Ok(d) => d,
                Err(RdmaError::Timeout { outstanding, .. }) => {
                    break Err(self.stalled(progress.elapsed(), outstanding));
                }
                Err(e) => break Err(e),
            };
            let mut failed = None;
            for d in done {
                match open.iter().position(|(t, _)| *t == d.ticket) {
                    Some(pos) => {
                        let (_, b) = open.swap_remove(pos);
                        inflight = inflight.saturating_sub(b);
                        progress = Instant::now();
                        match d.first_error() {
                            Some(e) => failed = failed.or_else(|| Some(e.clone())),
                            None => bytes += d.bytes(),
                        }
                    }
                    None => foreign.push(d),
                }
            }
            if let Some(e) = failed {
                break Err(RdmaError::Completion(e));
            }
        };
        if !foreign.is_empty() {
            self.cq.shared.lock().done_extend(foreign);
        }
        result
    }

    /// The error of a run that saw no completion for `waited`: what each queue pair and the
    /// port say now, and what that means.
    fn stalled(&self, waited: Duration, outstanding: usize) -> RdmaError {
        let states: Vec<String> = self
            .qps
            .iter()
            .map(|q| match q.state() {
                Ok(s) => format!("QP {:#x} {s}", q.qp_num()),
                Err(e) => format!("QP {:#x} unknown ({e})", q.qp_num()),
            })
            .collect();
        let port = self.ep.port_state();
        let any_err = self.qps.iter().any(|q| q.state().ok() == Some("ERR"));
        let cause = if any_err {
            "a queue pair is in the error state: the link or the peer failed"
        } else if !port.eq_ignore_ascii_case("active") {
            "the port is not active: the link is down"
        } else {
            "the queue pairs and the port are healthy: the peer stopped acknowledging (it \
             stopped, or the path between the hosts drops packets), or the device is slower \
             than the wait allows"
        };
        RdmaError::Timeout {
            waited,
            outstanding,
            detail: format!(
                "; {}; {} port {} {port}: {cause}",
                states.join(", "),
                self.ep.device(),
                self.ep.port().number
            ),
        }
    }
}
