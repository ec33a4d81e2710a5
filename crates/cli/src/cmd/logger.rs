//! The log sink of long-running commands (`gdx serve`): the engine's warnings (refused logins,
//! limit hits, evictions — rate-limited where they are raised) go to stderr, escaped, since
//! they quote what peers sent. `GDX_LOG=error|warn|info|debug|off` picks the level (warn).

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let level = match r.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug | Level::Trace => "debug",
        };
        let msg = gdx_topo::printable(&r.args().to_string());
        // Some engine messages start with "gdx: " already.
        let msg = msg.strip_prefix("gdx: ").unwrap_or(&msg);
        eprintln!("gdx serve: {level}: {msg}");
    }

    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

/// Installs the stderr logger at `GDX_LOG`'s level (warn by default).
///
/// # Errors
/// An unknown `GDX_LOG` value, naming the accepted ones.
pub fn init() -> anyhow::Result<()> {
    let level = match std::env::var("GDX_LOG").ok().as_deref() {
        None | Some("") | Some("warn") => LevelFilter::Warn,
        Some("error") => LevelFilter::Error,
        Some("info") => LevelFilter::Info,
        Some("debug") => LevelFilter::Debug,
        Some("off") => LevelFilter::Off,
        Some(other) => anyhow::bail!(
            "GDX_LOG={}: use error, warn, info, debug or off",
            gdx_topo::printable(other)
        ),
    };
    // Already set (a second call in one process): keep the first.
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
    Ok(())
}
