//! Transports: one implementation of [`Transport`] per backend.
//!
//! A transport runs whole transfers for one peer connection: it receives the transfer's shared state
//! (ops already planned and validated), moves the bytes, reports each op through
//! `XferState::chunk_done` / `fail_pending`, delivers the notification and calls `finish`: tcp
//! (with GPU staging), shm (with the GPU ipc path), rdma and fabric (libfabric).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::transfer::XferState;

pub(crate) use agent_view::AgentView;

mod agent_view;
pub(crate) mod fabric;
pub(crate) mod rdma;
pub(crate) mod shm;
pub(crate) mod tcp;

/// Ends `xfer` the way every transport does: if every op succeeded, delivers its notification
/// over the peer's control connection (a failed delivery fails the transfer), then `finish`.
/// A cancelled transfer's notification is not sent (`XferState::notification`).
pub(crate) fn notify_and_finish(xfer: &XferState, control: &Mutex<crate::conn::Conn>) {
    if let Some(data) = xfer.notification() {
        let mut c = control.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = c.request(&crate::wire::Msg::Notify {
            xfer: xfer.id,
            data,
        }) {
            xfer.fail_pending(&e);
            xfer.fail_transfer(e);
        }
    }
    xfer.finish();
}

/// `Transport::submit_new` the usual way: the state built, then submitted (the default, and
/// what a transport that sometimes posts first does otherwise).
pub(crate) fn submit_built<T: Transport + ?Sized>(
    t: &T,
    n: crate::transfer::NewTransfer<'_>,
) -> Arc<XferState> {
    let x = n.into_state();
    t.submit(Arc::clone(&x));
    x
}

/// The plug-in point for a data path backend.
pub(crate) trait Transport: Send + Sync + std::fmt::Debug {
    /// Starts running `xfer`; returns at once. The transport must eventually call `xfer.finish()`.
    fn submit(&self, xfer: Arc<XferState>);

    /// Starts a transfer whose state is not built yet and returns that state. The default
    /// builds it and calls `submit`; a transport that can put the request on the wire first
    /// (the shm ring) builds it after, so that work overlaps the peer's.
    fn submit_new(&self, n: crate::transfer::NewTransfer<'_>) -> Arc<XferState> {
        submit_built(self, n)
    }

    /// The driver of the transfers this transport leaves to whoever waits (`Drive`), if it
    /// does that.
    fn driver(&self) -> Option<Arc<dyn crate::transfer::Drive>> {
        None
    }

    /// The rails this transport runs over, if it has several links per peer (tcp).
    fn rails(&self) -> Option<Arc<crate::rails::Rails>> {
        None
    }

    /// Whether the connection under this transport is still usable.
    fn is_alive(&self) -> bool;

    /// Stops accepting work and closes the connection; running transfers fail with `PeerLost`.
    fn close(&self);
}

/// The submit side of a transport that runs whole transfers one at a time on its own thread
/// (shm, rdma): a queue to that thread and the connection's liveness.
#[derive(Debug)]
pub(crate) struct SerialQueue {
    tx: Mutex<Option<Sender<Arc<XferState>>>>,
    alive: Arc<AtomicBool>,
}

impl SerialQueue {
    /// Starts thread `name` running `run` over the queued transfers; `run` clears the flag it is
    /// given when the connection breaks.
    pub(crate) fn spawn(
        name: &str,
        run: impl FnOnce(Receiver<Arc<XferState>>, Arc<AtomicBool>) + Send + 'static,
    ) -> Result<SerialQueue> {
        let (tx, rx) = channel();
        let alive = Arc::new(AtomicBool::new(true));
        let a = Arc::clone(&alive);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(rx, a))
            .map_err(|e| Error::os("spawn", e))?;
        Ok(SerialQueue {
            tx: Mutex::new(Some(tx)),
            alive,
        })
    }

    /// Queues `xfer`, or fails it with `PeerLost` once the queue is closed.
    pub(crate) fn submit(&self, xfer: Arc<XferState>) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let rejected = match tx {
            Some(tx) => tx.send(xfer).err().map(|e| e.0),
            None => Some(xfer),
        };
        if let Some(x) = rejected {
            x.fail_pending(&Error::peer_lost("peer connection closed"));
            x.finish();
        }
    }

    /// Hands `xfer` to the thread again, as a request to finish it (a transfer it already
    /// knows); once the queue is closed, nothing (the thread finishes what it knows as it ends).
    pub(crate) fn nudge(&self, xfer: Arc<XferState>) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(xfer);
        }
    }

    /// Whether the connection is still usable.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Stops accepting transfers (the thread ends after the queued ones).
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.alive.store(false, Ordering::SeqCst);
    }
}

/// A serial queue is the whole transport for paths whose worker thread does all the work
/// (rdma, fabric): nothing else to hold on the submitting side.
impl Transport for SerialQueue {
    fn submit(&self, xfer: Arc<XferState>) {
        SerialQueue::submit(self, xfer);
    }

    fn is_alive(&self) -> bool {
        SerialQueue::is_alive(self)
    }

    fn close(&self) {
        SerialQueue::close(self);
    }
}
