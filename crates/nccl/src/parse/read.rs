//! Reading log files: regular files only, size-capped, line by line with a line-length cap, so
//! what a log costs is bounded whatever the path names (`/dev/zero`, a FIFO, a 1 GB file, a
//! 200 MB line).

use super::{finish, parse_line};
use crate::error::NcclError;
use crate::model::{NcclLog, ParseWarning};
use std::path::Path;

/// Largest log file read (bytes). A job's per-rank INFO logs are a few MiB; a bigger file is
/// most likely not a log, and reading it would only cost time.
pub const MAX_LOG_BYTES: u64 = 256 << 20;
/// Longest line kept (bytes); NCCL's longest lines (ring and tree listings) are a few KiB. The
/// rest of a longer line is skipped and a warning says so.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Read and parse the files in order, line by line (memory stays bounded by [`MAX_LINE_BYTES`]
/// and what the log says, not by the file's size). Only regular files of at most
/// [`MAX_LOG_BYTES`] are read: a FIFO, a device or a folder is refused before it is opened
/// (`/dev/zero` would never end, a FIFO without a writer would block).
pub fn parse_files<P: AsRef<Path>>(paths: &[P]) -> Result<NcclLog, NcclError> {
    let mut log = NcclLog::default();
    for p in paths {
        let p = p.as_ref();
        let f = open_log(p)?;
        parse_reader(
            &mut log,
            &p.display().to_string(),
            std::io::BufReader::new(f),
        )
        .map_err(|source| NcclError::ReadLog {
            path: p.to_path_buf(),
            source,
        })?;
    }
    finish(&mut log);
    Ok(log)
}

/// Opens a log for reading after checking, without opening it, that it is a regular file
/// within [`MAX_LOG_BYTES`].
fn open_log(p: &Path) -> Result<std::fs::File, NcclError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let refused = |why: String| NcclError::NotALog {
        path: p.to_path_buf(),
        why,
    };
    let io = |source| NcclError::ReadLog {
        path: p.to_path_buf(),
        source,
    };
    let m = std::fs::metadata(p).map_err(io)?;
    let t = m.file_type();
    if !t.is_file() {
        let kind = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(refused(format!(
            "{kind}; gdx reads regular files only (save the log to a file first)"
        )));
    }
    if m.len() > MAX_LOG_BYTES {
        return Err(refused(format!(
            "{} bytes, more than the {} MiB gdx reads; pass the per-rank files \
             (NCCL_DEBUG_FILE=...%h.%p) or cut the log",
            m.len(),
            MAX_LOG_BYTES >> 20
        )));
    }
    // O_NONBLOCK: should the path be swapped for a FIFO after the check, the open does not
    // wait for a writer (the file-type check below then refuses it).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(p)
        .map_err(io)?;
    if !f.metadata().map_err(io)?.file_type().is_file() {
        return Err(refused(
            "changed into something other than a regular file".into(),
        ));
    }
    Ok(f)
}

/// Parses `r` line by line into `log`: lines longer than [`MAX_LINE_BYTES`] are cut there (one
/// warning per file), reading stops after [`MAX_LOG_BYTES`] (a file that grows while read).
fn parse_reader(log: &mut NcclLog, source: &str, r: impl std::io::BufRead) -> std::io::Result<()> {
    let mut r = r.take(MAX_LOG_BYTES);
    log.sources.push(source.to_string());
    let mut buf = Vec::new();
    let mut lineno = 0usize;
    let mut long_lines = 0usize;
    loop {
        buf.clear();
        let (n, cut) = read_line_capped(&mut r, &mut buf, MAX_LINE_BYTES)?;
        if n == 0 {
            break;
        }
        lineno += 1;
        long_lines += usize::from(cut);
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        // Logs written by a crashing process can hold invalid UTF-8: keep what reads.
        let text = String::from_utf8_lossy(&buf);
        parse_line(log, source, lineno, &text);
    }
    if long_lines > 0 {
        log.parse_warnings.push(ParseWarning {
            source: source.to_string(),
            line: 0,
            message: format!(
                "{long_lines} line(s) longer than {MAX_LINE_BYTES} bytes: only their first \
                 {MAX_LINE_BYTES} bytes were read"
            ),
        });
    }
    Ok(())
}

/// Reads one line (through its `\n`) into `buf`, keeping at most `cap` bytes of it and skipping
/// the rest. Returns the bytes consumed and whether the line was cut.
fn read_line_capped(
    r: &mut impl std::io::BufRead,
    buf: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<(usize, bool)> {
    let mut consumed = 0usize;
    let mut cut = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((consumed, cut));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = cap.saturating_sub(buf.len());
        if take > room {
            cut = true;
        }
        buf.extend_from_slice(&chunk[..take.min(room)]);
        r.consume(take);
        consumed += take;
        if done {
            return Ok((consumed, cut));
        }
    }
}
