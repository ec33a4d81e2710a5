//! [`Mailbox`]: microsecond host↔GPU copies of small payloads through a persistent service
//! kernel (`gdx_mailbox` in `gdx_kernels.cu`) that polls a ring in mapped pinned host memory.
//!
//! A copy-engine copy of 8 bytes plus a stream synchronise costs 6–7 µs on the H200 test
//! machine; most of it is the driver's submission and completion path. Here the host writes
//! the request (header and payload, as self-validating "LL" words, see `layout`) into the ring
//! and spins on a completion word; the kernel, which never returns while the mailbox runs,
//! sees the request in one PCIe read, moves the payload to or from device memory and answers.
//! The price is one SM's worth of a block (256 threads) kept busy, which the planner states.
//!
//! Life cycle (RAII): [`Mailbox::start`] loads the PTX, launches the kernel on a stream of its
//! own and waits until it reports running; dropping the mailbox sets the stop word and waits for
//! the kernel to exit. A heartbeat thread advances a word the kernel watches: if the host
//! process dies or hangs, the kernel exits by itself after [`MailboxConfig::watchdog`], so no
//! SM is left spinning. Everything that waits on the kernel also watches its state word, so a
//! kernel that exited turns into an error, never a hang.
//!
//! Ops are served one at a time in ring order. [`Mailbox::write`] and [`Mailbox::read`] wait
//! for completion; [`Mailbox::write_nowait`] returns a [`Ticket`] so that up to `slots` writes
//! are in flight (the ticket borrows the destination and waits when dropped).
//!
//! **Caveat, measured on the H200 test machine:** while the kernel runs, driver calls that
//! wait for the context to go idle wait for it: a module load (`cuModuleLoadData` /
//! `cuModuleGetFunction` under CUDA's default lazy loading) hung, and freeing memory
//! (`cuMemFree` / `cuMemFreeHost`) in the same context did not return within 10 s. Load kernels
//! and free buffers before [`Mailbox::start`] or after the mailbox stops; the heartbeat keeps
//! running meanwhile, so the watchdog does not end such a wait.
//!
//! Device memory the mailbox writes or reads is touched outside any stream: each op first waits
//! for the buffer's queued copies (as host access to a buffer does), and work queued later on a
//! stream sees the bytes of every completed op (the kernel fences before it answers).

mod layout;

pub use layout::{KernelState, MAX_PAYLOAD};

/// The mailbox crossover the planner uses when no calibration says otherwise: ops of at most
/// this many bytes take the mailbox (measured on the H200 test machine: see BENCHMARKS.md).
pub const DEFAULT_CROSSOVER: usize = 2048;

use super::{Context, CudaError, DeviceBuffer, Kernel, KernelArgs, LaunchDims, MappedHostBuffer};
use super::{Heartbeat, Module, Stream};
use layout as l;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a [`Mailbox`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxConfig {
    /// Ring slots: writes that may be in flight at once (1 to 1024).
    pub slots: usize,
    /// Threads of the service block (a multiple of 32, 32 to 1024).
    pub threads: u32,
    /// The kernel exits when the host heartbeat has not advanced for this long.
    pub watchdog: Duration,
    /// How long an op may take before it is reported as lost.
    pub op_timeout: Duration,
    /// Request words warp 0 reads per poll (4 to 32): 16 is one 128-byte line, the header and
    /// 52 payload bytes; a write whose payload fits arrives in one PCIe read.
    pub poll_words: u32,
    /// Keep four staggered polls in flight per lane (a request is seen sooner after it lands).
    pub pipelined_poll: bool,
    /// With `pipelined_poll`: SM clock cycles between the staggered polls (rounded down to a
    /// multiple of 8; 0 takes 600, about 0.3 µs at H200 clocks).
    pub poll_gap_cycles: u32,
    /// Publish a write's completion with a system-scope release store instead of a full
    /// system fence before the store.
    pub release_store: bool,
    /// Publish a write's completion after a GPU-scope fence (`__threadfence()`) instead of a
    /// system-scope one: the payload is then in L2, which every later GPU-side reader (kernel,
    /// copy engine, peer) goes through; takes precedence over `release_store`.
    pub gpu_scope_done: bool,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        MailboxConfig {
            slots: 32,
            threads: 256,
            watchdog: Duration::from_secs(2),
            op_timeout: Duration::from_secs(5),
            // Measured on the H200 (2026-12-01, all 16 variants in one run): 8 poll words without
            // pipelining was fastest (8 B write 3.2 µs, read 2.85 µs); four staggered polls in
            // flight made it ~2x slower, the release store made no difference.
            poll_words: 8,
            pipelined_poll: false,
            poll_gap_cycles: 0,
            release_store: true,
            gpu_scope_done: false,
        }
    }
}

/// The kernel's poll-gap field (flags bits 16..31, in units of 8 cycles).
fn gap_field(cycles: u32) -> u32 {
    let c = if cycles == 0 { 600 } else { cycles };
    (c / 8).min(0xffff)
}

/// How long a waiting host thread spins before it starts yielding.
pub const SPIN: Duration = Duration::from_micros(20);

/// A running mailbox service kernel on one GPU. `Send + Sync`; ops from several threads are
/// served one after another.
pub struct Mailbox {
    ctx: Context,
    config: MailboxConfig,
    ring: Arc<MappedHostBuffer>,
    stream: Stream,
    host: Mutex<HostSide>,
    beat: Heartbeat,
    /// Keeps the module loaded while the kernel runs.
    _kernel: Kernel,
}

/// The host's side of the ring.
#[derive(Debug)]
struct HostSide {
    /// Sequence number of the next op (1-based).
    next: u64,
    /// Per slot: the write op still in flight there, if any.
    inflight: Vec<Option<u64>>,
    /// Set once an op was lost or the kernel exited: every later op fails with it.
    broken: Option<String>,
}

impl fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailbox")
            .field("gpu", &self.ctx.ordinal())
            .field("config", &self.config)
            .field("state", &self.state())
            .finish()
    }
}

fn mailbox_err(gpu: u32, what: impl Into<String>) -> CudaError {
    CudaError::Mailbox {
        gpu,
        what: what.into(),
    }
}

impl Mailbox {
    /// Load gdx's kernels into `ctx`, launch the service kernel on a new stream and wait until
    /// it runs.
    pub fn start(ctx: &Context, config: MailboxConfig) -> Result<Mailbox, CudaError> {
        if !(1..=1024).contains(&config.slots) {
            return Err(CudaError::InvalidArgument {
                call: "Mailbox::start",
                reason: format!("{} slots: want 1 to 1024", config.slots),
            });
        }
        if !(32..=1024).contains(&config.threads) || !config.threads.is_multiple_of(32) {
            return Err(CudaError::InvalidArgument {
                call: "Mailbox::start",
                reason: format!(
                    "{} threads: want a multiple of 32 from 32 to 1024",
                    config.threads
                ),
            });
        }
        if !(4..=32).contains(&config.poll_words) {
            return Err(CudaError::InvalidArgument {
                call: "Mailbox::start",
                reason: format!("{} poll words: want 4 to 32", config.poll_words),
            });
        }
        let module = Module::gdx_kernels(ctx)?;
        let kernel = module.kernel("gdx_mailbox")?;
        let ring = Arc::new(MappedHostBuffer::new(
            ctx,
            l::total_words(config.slots) * 8,
        )?);
        let stream = Stream::new(ctx)?;
        let every = (config.watchdog / 8).max(Duration::from_millis(1));
        let beat = Heartbeat::start(
            Arc::clone(&ring),
            l::CTL_HEARTBEAT,
            every,
            "gdx-mailbox-heartbeat",
        )
        .map_err(|e| {
            mailbox_err(
                ctx.ordinal(),
                format!("cannot start the heartbeat thread: {e}"),
            )
        })?;
        let mailbox = Mailbox {
            ctx: ctx.clone(),
            config,
            ring,
            stream,
            host: Mutex::new(HostSide {
                next: 1,
                inflight: vec![None; config.slots],
                broken: None,
            }),
            beat,
            _kernel: kernel.clone(),
        };
        let mut args = KernelArgs::new();
        args.push_u64(mailbox.ring.device_ptr())
            .push_u32(config.slots as u32)
            .push_u32(l::MAX_WORDS as u32)
            .push_u64(u64::try_from(config.watchdog.as_nanos()).unwrap_or(u64::MAX))
            .push_u32(config.poll_words)
            .push_u32(
                (u32::from(config.release_store) * l::FLAG_RELEASE_DONE)
                    | (u32::from(config.pipelined_poll) * l::FLAG_PIPELINED)
                    | (u32::from(config.gpu_scope_done) * l::FLAG_GPU_FENCE)
                    | (gap_field(config.poll_gap_cycles) << 16),
            );
        // SAFETY: gdx_mailbox(u64* base, u32 nslots, u32 max_words, u64 watchdog_ns,
        // u32 poll_words, u32 flags) matches the arguments; `base` is the mapped ring sized for `nslots` slots of `max_words`
        // payload words (layout::total_words), which the mailbox keeps alive until the kernel
        // has exited (Drop stops it and waits, or leaks the ring); the device addresses in
        // requests come from live DeviceBuffers that every op borrows until it completes.
        unsafe {
            mailbox
                .stream
                .launch(&kernel, LaunchDims::single_block(config.threads), &mut args)?
        };
        // Wait for the kernel to report in (a launch that failed leaves the stream idle).
        let start = Instant::now();
        loop {
            match mailbox.state() {
                KernelState::Running => break,
                s if s.exited() => {
                    return Err(mailbox_err(
                        ctx.ordinal(),
                        format!("the service kernel exited at start: {s:?}"),
                    ))
                }
                _ => {}
            }
            if mailbox.stream.is_idle()? {
                return Err(mailbox_err(
                    ctx.ordinal(),
                    "the service kernel finished without reporting in".to_string(),
                ));
            }
            if start.elapsed() > Duration::from_secs(10) {
                // Not resident (the GPU is full of other work): give up; Drop stops it.
                return Err(mailbox_err(
                    ctx.ordinal(),
                    "the service kernel did not start within 10 s (no free SM?)".to_string(),
                ));
            }
            std::thread::yield_now();
        }
        Ok(mailbox)
    }

    /// The context (GPU) the mailbox serves.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &MailboxConfig {
        &self.config
    }

    /// Streaming multiprocessors the service kernel occupies (one block, on one SM).
    pub fn sms_reserved(&self) -> u32 {
        1
    }

    /// What the kernel last reported.
    pub fn state(&self) -> KernelState {
        KernelState::from_word(self.ctl(l::CTL_STATE))
    }

    /// Ops the kernel served, as it reported when it exited (`None` while it runs).
    pub fn served(&self) -> Option<u64> {
        self.state().exited().then(|| self.ctl(l::CTL_SERVED))
    }

    /// Whether the kernel's stream is idle (the kernel has exited).
    pub fn kernel_gone(&self) -> Result<bool, CudaError> {
        self.stream.is_idle()
    }

    /// Stop advancing the heartbeat, as a hung or dead host would: the kernel's watchdog ends
    /// it within [`MailboxConfig::watchdog`]. For tests and diagnostics; ops fail afterwards.
    pub fn suspend_heartbeat(&self) {
        self.beat.suspend();
    }

    /// Why the kernel is gone, in words.
    fn exit_text(&self, s: KernelState) -> String {
        match s {
            KernelState::Watchdog => format!(
                "the service kernel exited: the host heartbeat stopped for {:?} (watchdog)",
                self.config.watchdog
            ),
            KernelState::BadOp => {
                let d = self.ctl(l::CTL_DETAIL);
                format!(
                    "the service kernel refused op {} of {} bytes and exited (a bug)",
                    d >> 32,
                    d as u32
                )
            }
            s => format!("the service kernel has exited ({s:?})"),
        }
    }

    fn ctl(&self, index: usize) -> u64 {
        self.ring
            .word(index)
            .map(|w| w.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    fn lock(&self) -> MutexGuard<'_, HostSide> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_len(&self, call: &'static str, len: usize) -> Result<u32, CudaError> {
        if len == 0 || len > l::MAX_PAYLOAD {
            return Err(CudaError::InvalidArgument {
                call,
                reason: format!(
                    "{len} bytes: a mailbox op carries 1 to {} bytes",
                    l::MAX_PAYLOAD
                ),
            });
        }
        Ok(len as u32)
    }

    /// Copy `bytes` into `dst` at `offset` and wait until they are in device memory.
    pub fn write(&self, dst: &DeviceBuffer, offset: usize, bytes: &[u8]) -> Result<(), CudaError> {
        self.write_nowait(dst, offset, bytes)?.wait()
    }

    /// Queue a copy of `bytes` into `dst` at `offset`; the [`Ticket`] waits for it (when
    /// [`Ticket::wait`]ed or dropped). `bytes` is copied into the ring before this returns.
    pub fn write_nowait<'a>(
        &'a self,
        dst: &'a DeviceBuffer,
        offset: usize,
        bytes: &[u8],
    ) -> Result<Ticket<'a>, CudaError> {
        const CALL: &str = "Mailbox::write";
        let len = self.check_len(CALL, bytes.len())?;
        let addr = self.device_range(dst, offset, bytes.len(), "destination device buffer")?;
        let mut host = self.lock();
        let seq = self.take_slot(&mut host)?;
        let base = l::slot_base(seq, self.config.slots);
        let words = self.slot_words(base)?;
        let f = l::flag(seq);
        for i in 0..l::payload_words(bytes.len()) {
            words[l::HDR_WORDS + i].store(l::ll(f, l::pack_word(bytes, i)), Ordering::Relaxed);
        }
        for (i, w) in l::header(seq, l::OP_WRITE, len, addr)
            .into_iter()
            .enumerate()
        {
            words[i].store(w, Ordering::Release);
        }
        host.inflight[self.slot_of(seq)] = Some(seq);
        Ok(Ticket {
            mailbox: self,
            seq,
            done: false,
            _dst: PhantomData,
        })
    }

    /// Copy `out.len()` bytes of `src` at `offset` into `out`.
    pub fn read(&self, src: &DeviceBuffer, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        const CALL: &str = "Mailbox::read";
        let len = self.check_len(CALL, out.len())?;
        let addr = self.device_range(src, offset, out.len(), "source device buffer")?;
        let mut host = self.lock();
        let seq = self.take_slot(&mut host)?;
        let base = l::slot_base(seq, self.config.slots);
        let words = self.slot_words(base)?;
        let f = l::flag(seq);
        for (i, w) in l::header(seq, l::OP_READ, len, addr)
            .into_iter()
            .enumerate()
        {
            words[i].store(w, Ordering::Release);
        }
        let n = l::payload_words(out.len());
        let resp = &words[l::RESP_OFF..l::RESP_OFF + n];
        // The kernel writes the words in any order; the last one is a good first look.
        let all_there = || {
            l::flag_of(resp[n - 1].load(Ordering::Acquire)) == f
                && resp
                    .iter()
                    .all(|w| l::flag_of(w.load(Ordering::Acquire)) == f)
        };
        if let Err(e) = self.wait_until(all_there) {
            host.broken = Some(e.to_string());
            return Err(e);
        }
        for (i, w) in resp.iter().enumerate() {
            l::unpack_word(out, i, l::data_of(w.load(Ordering::Acquire)));
        }
        Ok(())
    }

    /// The device address of `len` bytes at `offset` of `buf`, after its queued copies.
    fn device_range(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        what: &'static str,
    ) -> Result<u64, CudaError> {
        if !buf.context().same(&self.ctx) {
            return Err(CudaError::InvalidArgument {
                call: "Mailbox",
                reason: format!(
                    "the buffer is on GPU {} and the mailbox serves GPU {}",
                    buf.context().ordinal(),
                    self.ctx.ordinal()
                ),
            });
        }
        if offset.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(CudaError::OutOfBounds {
                what,
                offset,
                len,
                size: buf.len(),
            });
        }
        buf.synchronize()?;
        Ok(buf.as_raw() + offset as u64)
    }

    fn slot_of(&self, seq: u64) -> usize {
        ((seq - 1) % self.config.slots as u64) as usize
    }

    fn slot_words(&self, base: usize) -> Result<&[std::sync::atomic::AtomicU64], CudaError> {
        self.ring
            .word_range(base, l::SLOT_WORDS)
            .ok_or_else(|| mailbox_err(self.ctx.ordinal(), "ring slot out of range (a bug)"))
    }

    /// The next sequence number, once its slot's previous write is done.
    fn take_slot(&self, host: &mut HostSide) -> Result<u64, CudaError> {
        if let Some(why) = &host.broken {
            return Err(mailbox_err(
                self.ctx.ordinal(),
                format!("unusable after an earlier failure: {why}"),
            ));
        }
        let seq = host.next;
        let slot = self.slot_of(seq);
        if let Some(prev) = host.inflight[slot] {
            if let Err(e) = self.wait_done(prev) {
                host.broken = Some(e.to_string());
                return Err(e);
            }
            host.inflight[slot] = None;
        }
        host.next += 1;
        Ok(seq)
    }

    fn done_word(&self, seq: u64) -> u64 {
        self.ctl(l::slot_base(seq, self.config.slots) + l::DONE_OFF)
    }

    /// Wait until write `seq`'s done word says so.
    fn wait_done(&self, seq: u64) -> Result<(), CudaError> {
        self.wait_until(|| self.done_word(seq) == seq)
    }

    /// Spin on `ready`, then yield between looks; fail when the kernel has exited or the op
    /// timeout passed.
    fn wait_until(&self, mut ready: impl FnMut() -> bool) -> Result<(), CudaError> {
        let start = Instant::now();
        let mut looks: u32 = 0;
        loop {
            if ready() {
                return Ok(());
            }
            looks = looks.wrapping_add(1);
            let waited = start.elapsed();
            if waited < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if looks.is_multiple_of(64) {
                let s = self.state();
                if s.exited() {
                    // One last look: the op may have completed just before the exit.
                    if ready() {
                        return Ok(());
                    }
                    return Err(mailbox_err(self.ctx.ordinal(), self.exit_text(s)));
                }
                if waited > self.config.op_timeout {
                    return Err(mailbox_err(
                        self.ctx.ordinal(),
                        format!(
                            "an op was not served within {:?} (kernel state {s:?})",
                            self.config.op_timeout
                        ),
                    ));
                }
            }
            std::thread::yield_now();
        }
    }
}

/// A queued [`Mailbox::write_nowait`]; waits for it when dropped.
#[must_use = "dropping a ticket waits for its write"]
pub struct Ticket<'a> {
    mailbox: &'a Mailbox,
    seq: u64,
    done: bool,
    _dst: PhantomData<&'a DeviceBuffer>,
}

impl fmt::Debug for Ticket<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("seq", &self.seq).finish()
    }
}

impl Ticket<'_> {
    /// The op's sequence number (1-based, in submission order).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether the write is in device memory (never blocks).
    pub fn is_done(&self) -> bool {
        self.mailbox.done_word(self.seq) == self.seq
    }

    /// Wait until the write is in device memory.
    pub fn wait(mut self) -> Result<(), CudaError> {
        self.done = true;
        self.finish()
    }

    fn finish(&self) -> Result<(), CudaError> {
        let r = self.mailbox.wait_done(self.seq);
        let mut host = self.mailbox.lock();
        let slot = self.mailbox.slot_of(self.seq);
        match &r {
            Ok(()) if host.inflight[slot] == Some(self.seq) => host.inflight[slot] = None,
            Ok(()) => {}
            Err(e) => host.broken = Some(e.to_string()),
        }
        r
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.finish() {
                log::warn!("mailbox write {} lost: {e}", self.seq);
            }
        }
    }
}

/// How a [`Mailbox`] ended ([`Mailbox::stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReport {
    /// The kernel's last state (`Stopped` after a clean stop, `Watchdog` if it had already
    /// exited on its own).
    pub state: KernelState,
    /// Ops it served, as it reported.
    pub served: u64,
    /// Whether its stream was idle afterwards (the kernel is gone from the GPU).
    pub kernel_gone: bool,
}

impl Mailbox {
    /// Stop the kernel, wait for it to leave the GPU, and say how it ended.
    pub fn stop(mut self) -> Result<StopReport, CudaError> {
        let report = self.shutdown();
        if !report.kernel_gone {
            return Err(mailbox_err(
                self.ctx.ordinal(),
                format!(
                    "the service kernel did not exit within 10 s of the stop word (state {:?})",
                    report.state
                ),
            ));
        }
        Ok(report)
    }

    /// Set the stop word, wait (bounded) for the kernel's stream to go idle, end the heartbeat.
    /// Idempotent.
    fn shutdown(&mut self) -> StopReport {
        if let Some(w) = self.ring.word(l::CTL_STOP) {
            w.store(1, Ordering::Release);
        }
        // The kernel looks at the stop word every few polls.
        let start = Instant::now();
        let mut gone = false;
        while start.elapsed() < Duration::from_secs(10) {
            match self.stream.is_idle() {
                Ok(true) => {
                    gone = true;
                    break;
                }
                Ok(false) => std::thread::yield_now(),
                Err(e) => {
                    self.ctx.record_err(e);
                    break;
                }
            }
        }
        if !self.beat.stop() {
            log::warn!("the mailbox heartbeat thread panicked");
        }
        StopReport {
            state: self.state(),
            served: self.ctl(l::CTL_SERVED),
            kernel_gone: gone,
        }
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        let report = self.shutdown();
        if !report.kernel_gone {
            // The kernel may still read the ring: never free memory it polls.
            log::warn!(
                "the mailbox kernel on GPU {} did not exit within 10 s of the stop word \
                 (state {:?}); leaking its ring",
                self.ctx.ordinal(),
                report.state
            );
            std::mem::forget(Arc::clone(&self.ring));
        }
    }
}
