//! [`Heartbeat`]: a host thread that advances one word of mapped host memory at a fixed
//! period, for a persistent kernel's watchdog (the mailbox's, `gdx stream`'s service kernel):
//! the kernel exits when the word stops moving, because the host process died or hung, so no
//! SM is left spinning for ever.

use super::MappedHostBuffer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The heartbeat thread of one persistent kernel; stops (and joins) on [`Heartbeat::stop`] or
/// when dropped.
#[derive(Debug)]
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Start a thread named `name` that adds 1 to word `index` of `buf` every `every`.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(
        buf: Arc<MappedHostBuffer>,
        index: usize,
        every: Duration,
        name: &str,
    ) -> std::io::Result<Heartbeat> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    if let Some(w) = buf.word(index) {
                        w.fetch_add(1, Ordering::Release);
                    }
                    std::thread::park_timeout(every);
                }
            })?;
        Ok(Heartbeat {
            stop,
            thread: Some(thread),
        })
    }

    /// Stop advancing the word, as a hung or dead host would (the kernel's watchdog then ends
    /// it); the thread ends at its next beat.
    pub fn suspend(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Stop and join the thread. `false` when it had panicked. Idempotent.
    pub fn stop(&mut self) -> bool {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => {
                t.thread().unpark();
                t.join().is_ok()
            }
            None => true,
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if !self.stop() {
            log::warn!("a persistent kernel's heartbeat thread panicked");
        }
    }
}
