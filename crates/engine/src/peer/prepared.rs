//! [`PreparedTransfer`]: a transfer validated and planned once ([`crate::Peer::prepare`]) and
//! posted many times, its state re-armed in place when the last post is over.

use std::sync::Arc;
use std::time::Duration;

use super::Peer;
use crate::error::Result;
use crate::routing::plan::Path;
use crate::transfer::{rearm, TransferHandle, TransferReport, XferState};

/// A batch of ops to one peer, checked and planned once, to post again and again (what
/// [`crate::Peer::prepare`] returns). Each [`PreparedTransfer::post`] starts the same ops and
/// returns a [`TransferHandle`] like [`crate::Peer::submit`]'s; the bytes are read from the
/// local region at each post, so a caller rewrites them between posts.
///
/// A post while an earlier one is still running (or its handle is still held) runs too, on a
/// state of its own; the state is reused only when nothing else holds it.
#[derive(Debug)]
pub struct PreparedTransfer {
    peer: Peer,
    state: Arc<XferState>,
    /// The transfer's deadline from each post (its own timeout, else the agent's default).
    timeout: Duration,
}

impl PreparedTransfer {
    pub(crate) fn new(peer: Peer, state: XferState, timeout: Duration) -> Self {
        PreparedTransfer {
            peer,
            state: Arc::new(state),
            timeout,
        }
    }

    /// Starts the ops once more; returns at once.
    ///
    /// # Errors
    /// [`crate::Error::PeerLost`] if the connection broke (nothing is sent). Errors of the ops
    /// themselves (a region the target freed since) come from the handle's wait.
    pub fn post(&mut self) -> Result<TransferHandle> {
        rearm(&mut self.state, self.timeout);
        self.peer.post_prepared(&self.state)?;
        Ok(TransferHandle {
            state: Arc::clone(&self.state),
        })
    }

    /// Posts and waits up to `timeout` ([`TransferHandle::wait`]).
    ///
    /// # Errors
    /// As [`PreparedTransfer::post`] and [`TransferHandle::wait`].
    pub fn run(&mut self, timeout: Duration) -> Result<TransferReport> {
        self.post()?.wait(timeout)
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.state.ops.len()
    }

    /// Always false: [`crate::Peer::prepare`] refuses an empty batch.
    pub fn is_empty(&self) -> bool {
        self.state.ops.is_empty()
    }

    /// The path each op was planned on (the plans themselves are in each post's report).
    pub fn paths(&self) -> Vec<Path> {
        self.state.paths().collect()
    }

    /// The peer it posts to.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}
