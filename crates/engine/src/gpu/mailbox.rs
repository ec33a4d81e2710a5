//! The mailbox path of [`LocalPeer`]: [`LocalPeer::start_mailbox`] runs gdx-sys's
//! [`Mailbox`] (a persistent kernel polling a ring in mapped host memory) on one GPU; while it
//! runs, the planner sends small pinned-host ↔ GPU ops there (`Path::Mailbox`, at most the
//! crossover; see [`crate::routing::planner`]) and every plan says so, with the SM it costs.
//!
//! The mailbox is explicit: nothing starts it behind the caller's back (it occupies an SM and
//! keeps one host thread's heartbeat), and [`LocalPeer::stop_mailbox`] or dropping the last
//! clone of the peer stops it. Ops ordered with a caller's stream or event never take it (the
//! kernel runs outside streams); strict mode makes that an error instead of a quiet change of
//! path.
//!
//! While a mailbox kernel runs, a driver call that waits for the whole context to go idle
//! waits until the mailbox stops. Measured on the H200: loading a module and freeing memory
//! (`cuMemFree`/`cuMemFreeHost`, i.e. dropping a region) in that GPU's context did not return
//! while the kernel ran. Allocate and free the regions the mailbox serves before
//! [`LocalPeer::start_mailbox`] or after [`LocalPeer::stop_mailbox`].

use std::sync::Arc;

use gdx_sys::cuda::mailbox::{StopReport, MAX_PAYLOAD};
use gdx_sys::cuda::{Mailbox, MailboxConfig};

use super::exec::{lock_pair, Guard};
use super::region::Mem;
use super::LocalPeer;
use crate::error::{Error, Result};
use crate::routing::planner::MailboxFacts;

impl LocalPeer {
    /// Start the mailbox on GPU `gpu` with the default configuration (see
    /// [`LocalPeer::start_mailbox_with`]).
    pub fn start_mailbox(&self, gpu: u32) -> Result<()> {
        self.start_mailbox_with(gpu, MailboxConfig::default())
    }

    /// Start the mailbox on GPU `gpu`: load the PTX, launch the service kernel, wait until it
    /// runs. Cached plans are dropped, so the next small host ↔ GPU op plans to `mailbox`.
    /// Starting it twice is an error naming the running one.
    pub fn start_mailbox_with(&self, gpu: u32, config: MailboxConfig) -> Result<()> {
        let g = self.gpu(gpu)?;
        let mut boxes = self.mailboxes();
        if boxes.contains_key(&gpu) {
            return Err(Error::InvalidArgument(format!(
                "a mailbox already runs on GPU{gpu}; stop it first"
            )));
        }
        let mb = Mailbox::start(&g.ctx, config)?;
        boxes.insert(gpu, Arc::new(mb));
        drop(boxes);
        self.forget_plans();
        Ok(())
    }

    /// Stop the mailbox on GPU `gpu` and say how it ended; `None` when none ran. Ops in flight
    /// on other threads finish first (they hold the mailbox).
    pub fn stop_mailbox(&self, gpu: u32) -> Result<Option<StopReport>> {
        let Some(mb) = self.mailboxes().remove(&gpu) else {
            return Ok(None);
        };
        self.forget_plans();
        // Wait for other holders (an op running right now) to let go.
        let mut mb = mb;
        let start = std::time::Instant::now();
        let owned = loop {
            match Arc::try_unwrap(mb) {
                Ok(m) => break m,
                Err(again) if start.elapsed() < std::time::Duration::from_secs(10) => {
                    mb = again;
                    std::thread::yield_now();
                }
                Err(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "the mailbox on GPU{gpu} is still in use after 10 s"
                    )))
                }
            }
        };
        Ok(Some(owned.stop()?))
    }

    /// Whether a mailbox runs on GPU `gpu`.
    pub fn mailbox_running(&self, gpu: u32) -> bool {
        self.mailboxes().contains_key(&gpu)
    }

    /// What the planner needs about the mailbox on `gpu`, if one runs.
    pub(crate) fn mailbox_facts(
        &self,
        gpu: Option<u32>,
        stream_ordered: bool,
    ) -> Option<MailboxFacts> {
        let gpu = gpu?;
        let boxes = self.mailboxes();
        let mb = boxes.get(&gpu)?;
        Some(MailboxFacts {
            gpu,
            sms: mb.sms_reserved(),
            max_payload: MAX_PAYLOAD as u64,
            stream_ordered,
        })
    }

    fn mailboxes(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, Arc<Mailbox>>> {
        self.shared
            .mailboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn forget_plans(&self) {
        self.shared
            .plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self
            .shared
            .last_plan
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Run a planned mailbox op: pinned host ↔ GPU, on the caller's thread, complete on return.
    pub(crate) fn run_mailbox(
        &self,
        dst: Mem<'_>,
        dst_off: u64,
        src: Mem<'_>,
        src_off: u64,
        len: u64,
    ) -> Result<()> {
        let gpu = match (dst, src) {
            (Mem::Gpu(r), Mem::Pinned(_)) | (Mem::Pinned(_), Mem::Gpu(r)) => r.gpu(),
            _ => {
                return Err(Error::InvalidArgument(
                    "the mailbox moves bytes between pinned host and GPU memory".to_string(),
                ))
            }
        };
        let mb = self.mailboxes().get(&gpu).cloned().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "planned for the mailbox on GPU{gpu}, which has stopped since; plan again"
            ))
        })?;
        let (a, b) = (to_usize(dst_off)?, to_usize(src_off)?);
        let n = to_usize(len)?;
        let (mut d, s) = lock_pair(dst, src)?;
        match (&mut d, &s) {
            (Guard::D(dev), Guard::P(host)) => {
                let bytes = host.as_slice()?;
                mb.write(dev, a, &bytes[b..b + n])?;
            }
            (Guard::P(host), Guard::D(dev)) => {
                let out = host.as_mut_slice()?;
                mb.read(dev, b, &mut out[a..a + n])?;
            }
            _ => {
                return Err(Error::InvalidArgument(
                    "the mailbox moves bytes between pinned host and GPU memory".to_string(),
                ))
            }
        }
        Ok(())
    }
}

fn to_usize(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::InvalidArgument(format!("{v} does not fit in memory")))
}
