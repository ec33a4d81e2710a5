#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The child process of the mailbox kill test (`tests/cuda_mailbox_kill.rs`): starts a mailbox
//! on GPU `GDX_TEST_GPU` with the watchdog given in milliseconds as the first argument, checks
//! one round trip, prints `READY <pid>` and then sleeps until killed.

use gdx_sys::cuda::{Cuda, DeviceBuffer, Mailbox, MailboxConfig};
use std::io::Write;
use std::time::Duration;

fn main() {
    let watchdog_ms: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let gpu = std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let ctx = Cuda::load().unwrap().context(gpu).unwrap();
    let mb = Mailbox::start(
        &ctx,
        MailboxConfig {
            watchdog: Duration::from_millis(watchdog_ms),
            ..MailboxConfig::default()
        },
    )
    .unwrap();
    let dev = DeviceBuffer::new(&ctx, 8).unwrap();
    mb.write(&dev, 0, &42u64.to_le_bytes()).unwrap();
    let mut back = [0u8; 8];
    mb.read(&dev, 0, &mut back).unwrap();
    assert_eq!(u64::from_le_bytes(back), 42);
    println!("READY {}", std::process::id());
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
