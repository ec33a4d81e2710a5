//! Result sinks: where each frame's result goes.
//!
//! The pipeline hands every result to its [`Sink`] in sequence order and stamps the frame's
//! end-to-end latency when [`Sink::deliver`] returns: a result counts as delivered once the sink
//! has taken it (written to the file's buffer, landed in the peer's region).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use super::kernel::Output;
use gdx_engine::{Error, Result};

/// One frame's result, as the sink receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameResult {
    /// The frame's sequence number (gaps are dropped frames).
    pub seq: u64,
    /// The frame's bytes.
    pub len: usize,
    /// When the source stamped the frame.
    pub stamp: Instant,
    /// What the kernel computed.
    pub output: Output,
}

/// Where results go. Implement it to plug your own consumer in.
pub trait Sink: Send {
    /// A short name for reports (`null`, `file:/tmp/r.tsv`, `peer:host:port`).
    fn name(&self) -> String;

    /// Take one result.
    ///
    /// # Errors
    /// A sink that cannot take more (a full disk, a lost peer): the pipeline stops at once and
    /// its error names this sink and the frame.
    fn deliver(&mut self, r: &FrameResult) -> Result<()>;

    /// Flush whatever is buffered; called once after the last result.
    ///
    /// # Errors
    /// As for [`Sink::deliver`].
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

impl<S: Sink + ?Sized> Sink for Box<S> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn deliver(&mut self, r: &FrameResult) -> Result<()> {
        (**self).deliver(r)
    }
    fn finish(&mut self) -> Result<()> {
        (**self).finish()
    }
}

/// Results are counted and timed, then discarded.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> String {
        "null".into()
    }

    fn deliver(&mut self, _r: &FrameResult) -> Result<()> {
        Ok(())
    }
}

/// `file:PATH`: one tab-separated line per result (`seq len word0 word1`, after a header line),
/// buffered; a write error (a full disk) stops the pipeline.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    out: BufWriter<File>,
}

impl FileSink {
    /// Create (or truncate) `path`.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: impl Into<PathBuf>) -> Result<FileSink> {
        let path = path.into();
        let f = File::create(&path)
            .map_err(|e| Error::os("create (stream file sink)", at_path(&path, e)))?;
        let mut s = FileSink {
            path,
            out: BufWriter::new(f),
        };
        s.write(b"seq\tlen\tword0\tword1\n")?;
        Ok(s)
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b).map_err(|e| self.err(e))
    }

    fn err(&self, e: std::io::Error) -> Error {
        Error::os("write (stream file sink)", at_path(&self.path, e))
    }
}

/// An I/O error that names the file; the original error stays its source.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
struct AtPath {
    path: String,
    #[source]
    source: std::io::Error,
}

fn at_path(path: &std::path::Path, source: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        source.kind(),
        AtPath {
            path: path.display().to_string(),
            source,
        },
    )
}

impl Sink for FileSink {
    fn name(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn deliver(&mut self, r: &FrameResult) -> Result<()> {
        let [a, b] = r.output.0;
        let line = format!("{}\t{}\t{a:#018x}\t{b:#018x}\n", r.seq, r.len);
        self.write(line.as_bytes())
    }

    fn finish(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| self.err(e))?;
        self.out.get_ref().sync_data().map_err(|e| self.err(e))
    }
}
