//! [`BenchError`]: why a case, or one size of it, could not be measured — one variant per
//! source, each keeping the library's own error as its `source()` so nothing is flattened into
//! text that a caller would have to parse back. The runner records its `Display` (with the
//! chain) as the case's or the row's message.
//!
//! A verification mismatch is not an error: the row is measured and fails with
//! `verified: false` and the [`Mismatch`] as its note.

use std::fmt;

use gdx_sys::cuda::CudaError;

/// Why a case (or one size) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The case cannot run against this peer (it lacks what the case needs): reported as
    /// waived with this reason, not as a failure.
    #[error("{0}")]
    Waived(String),
    /// A CUDA driver call failed (the error names the call and the GPU).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A vendor library the case needs did not load.
    #[error(transparent)]
    Unavailable(#[from] gdx_sys::Unavailable),
    /// An engine call failed.
    #[error("{context}: {source}")]
    Engine {
        /// What gdx-bench asked the engine for.
        context: String,
        /// The engine's error.
        #[source]
        source: gdx_engine::Error,
    },
    /// The rdma bench (gdx-rdma) failed.
    #[error("{context}: {source}")]
    Rdma {
        /// Against which server.
        context: String,
        /// gdx-rdma's error.
        #[source]
        source: gdx_rdma::RdmaError,
    },
    /// A file, socket or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The engine moved the bytes over another path than the one the case measures.
    #[error("{context} over {took}, not {want}")]
    WrongPath {
        /// Which transfer or connection.
        context: String,
        /// The path it took.
        took: gdx_engine::Path,
        /// The path the case measures.
        want: gdx_engine::Path,
    },
    /// The second process of the ipc cases failed (its message, status and stderr).
    #[error("{0}")]
    IpcChild(String),
    /// What was asked cannot be measured here (a size larger than the peer's region, a
    /// calibration file that does not read, an agent without an address).
    #[error("{0}")]
    Unmeasurable(String),
    /// Drawing the plot failed.
    #[error("plotting: {0}")]
    Plot(String),
    /// A plot file that is neither `.svg` nor `.png`.
    #[error("--plot {}: the file must end in .svg or .png", .0.display())]
    PlotFormat(std::path::PathBuf),
    /// A PNG plot could not be converted: `rsvg-convert` failed (`status`) or is missing
    /// (`source`).
    #[error("{}", rsvg_why(path, status, source))]
    Rsvg {
        /// The PNG asked for.
        path: std::path::PathBuf,
        /// Its exit status, when it ran.
        status: Option<std::process::ExitStatus>,
        /// Why it did not start.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The report could not be encoded as JSON.
    #[error("encoding the report as JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The case panicked (a bug; the run goes on).
    #[error("panicked: {0}")]
    Panicked(String),
}

fn rsvg_why(
    path: &std::path::Path,
    status: &Option<std::process::ExitStatus>,
    source: &Option<std::io::Error>,
) -> String {
    match (status, source) {
        (_, Some(e)) => format!(
            "writing a PNG needs rsvg-convert ({e}; apt-get install librsvg2-bin), or give a .svg file"
        ),
        (Some(s), None) => format!("rsvg-convert failed ({s}) writing {}", path.display()),
        (None, None) => format!("rsvg-convert did not write {}", path.display()),
    }
}

impl BenchError {
    /// A closure turning an engine error into [`BenchError::Engine`] with `context`.
    pub fn engine(context: impl Into<String>) -> impl FnOnce(gdx_engine::Error) -> BenchError {
        let context = context.into();
        move |source| BenchError::Engine { context, source }
    }

    /// A closure turning an I/O error into [`BenchError::Io`] with `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let context = context.into();
        move |source| BenchError::Io { context, source }
    }

    /// The message with every cause, as rows and case outcomes record it (`a: b: c`), each
    /// cause once even where a `Display` already includes its source.
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(self);
        while let Some(e) = cur {
            let t = e.to_string();
            if !s.contains(&t) {
                s.push_str(": ");
                s.push_str(&t);
            }
            cur = e.source();
        }
        s
    }
}

/// An engine error with no more context than "engine call" (the timing closures' errors).
impl From<gdx_engine::Error> for BenchError {
    fn from(source: gdx_engine::Error) -> Self {
        BenchError::Engine {
            context: "engine call".into(),
            source,
        }
    }
}

/// The first differing byte of a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset of the byte.
    pub offset: u64,
    /// What the source holds there.
    pub expected: u8,
    /// What the destination holds.
    pub found: u8,
}

impl Mismatch {
    /// The first differing byte of two equal-length slices, `base` added to its offset.
    pub fn find(got: &[u8], want: &[u8], base: u64) -> Option<Mismatch> {
        let pos = got.iter().zip(want).position(|(a, b)| a != b)?;
        Some(Mismatch {
            offset: base + pos as u64,
            expected: want[pos],
            found: got[pos],
        })
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "verification failed: byte {}: expected {:#04x}, found {:#04x}",
            self.offset, self.expected, self.found
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_each_cause_once() {
        let e = BenchError::io("reading x")(std::io::Error::other("disk gone"));
        assert_eq!(e.to_string(), "reading x: disk gone");
        assert_eq!(e.chain(), "reading x: disk gone");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the source is kept"
        );
    }

    #[test]
    fn mismatches_name_the_first_differing_byte() {
        let m = Mismatch::find(&[1, 2, 9], &[1, 2, 3], 100).unwrap();
        assert_eq!(
            m.to_string(),
            "verification failed: byte 102: expected 0x03, found 0x09"
        );
        assert_eq!(Mismatch::find(&[1], &[1], 0), None);
    }
}
