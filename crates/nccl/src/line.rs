//! One line of an NCCL debug log, split into who printed it and what it says.
//!
//! NCCL (2.10 – 2.28) prints `host:pid:tid [cudaDev] NCCL INFO message`. Launchers and NCCL
//! options add to the front: `[rank]` from `mpirun --tag-output`, `[2025-07-21 19:05:29]`
//! from `NCCL_DEBUG_TIMESTAMP_FORMAT` (2.26+), a source location before `NCCL WARN`. Some
//! tools strip the prefix entirely (PyTorch's logger, issue pastes) and leave the bare
//! message. The splitter reads the prefix from the right of the level marker, so a hostname
//! that is empty (`::16674:17023`) or contains colons still yields pid and tid.
//!
//! Invariant: [`split`] never fails; a line it cannot place is [`Kind::Other`].

/// The severity NCCL printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `NCCL INFO`.
    Info,
    /// `NCCL WARN`.
    Warn,
    /// No marker: a bare message (stripped prefix, or `NCCL version` on stdout).
    Bare,
}

/// Who printed a line, when the prefix says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// Hostname (may be empty when the log was anonymised).
    pub host: Option<String>,
    /// Process id.
    pub pid: Option<u32>,
    /// The CUDA device in brackets (`[3]`).
    pub dev: Option<u32>,
}

/// A split line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// Severity.
    pub level: Level,
    /// Who printed it.
    pub origin: Origin,
    /// The text after the level marker (or the whole trimmed line when bare).
    pub msg: &'a str,
}

/// What kind of line this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind<'a> {
    /// An NCCL line.
    Nccl(Line<'a>),
    /// Anything else (launcher output, timestamps, wrapped continuations).
    Other,
}

/// Split one raw line.
pub fn split(raw: &str) -> Kind<'_> {
    let line = raw.trim_end_matches(['\r', '\n']).trim_end();
    for (marker, level) in [(" NCCL INFO ", Level::Info), (" NCCL WARN ", Level::Warn)] {
        if let Some(at) = find_marker(line, marker) {
            let prefix = &line[..at];
            let msg = line[at + marker.len()..].trim();
            return Kind::Nccl(Line {
                level,
                origin: origin(prefix),
                msg,
            });
        }
    }
    // `NCCL INFO` at the very start (a prefix stripped up to the marker).
    for (marker, level) in [("NCCL INFO ", Level::Info), ("NCCL WARN ", Level::Warn)] {
        if let Some(rest) = line.trim_start().strip_prefix(marker) {
            return Kind::Nccl(Line {
                level,
                origin: Origin::default(),
                msg: rest.trim(),
            });
        }
    }
    let t = line.trim();
    if t.is_empty() {
        return Kind::Other;
    }
    Kind::Nccl(Line {
        level: Level::Bare,
        origin: Origin::default(),
        msg: t,
    })
}

/// The byte offset of `marker` (first occurrence), char-boundary safe.
fn find_marker(line: &str, marker: &str) -> Option<usize> {
    line.find(marker)
}

/// Read `... host:pid:tid [dev] [file.cc:123]` from the right.
fn origin(prefix: &str) -> Origin {
    let mut o = Origin::default();
    let tokens: Vec<&str> = prefix.split_whitespace().collect();
    // The last `[N]` token is the device; a `file.cc:123` token may follow it (WARN lines).
    let Some(dev_at) = tokens
        .iter()
        .rposition(|t| bracketed_number(t).is_some() && !t.contains('-'))
    else {
        return o;
    };
    o.dev = bracketed_number(tokens[dev_at]);
    if dev_at == 0 {
        return o;
    }
    let hpt = tokens[dev_at - 1];
    let mut parts = hpt.rsplitn(3, ':');
    let (tid, pid, host) = (parts.next(), parts.next(), parts.next());
    let tid_ok = tid.is_some_and(|t| t.parse::<u64>().is_ok());
    if let (true, Some(pid), Some(host)) = (tid_ok, pid, host) {
        if let Ok(p) = pid.parse::<u32>() {
            o.pid = Some(p);
            // An anonymised paste leaves `::pid:tid`; the host is then empty, not ":".
            o.host = Some(host.trim_matches(':').to_string());
        }
    }
    o
}

/// `[12]` → 12.
fn bracketed_number(t: &str) -> Option<u32> {
    t.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nccl(raw: &str) -> Line<'_> {
        match split(raw) {
            Kind::Nccl(l) => l,
            Kind::Other => panic!("not an NCCL line: {raw}"),
        }
    }

    #[test]
    fn plain_prefix_gives_host_pid_dev() {
        let l = nccl("hostname1:25668:27396 [0] NCCL INFO Using network IB");
        assert_eq!(l.level, Level::Info);
        assert_eq!(l.origin.host.as_deref(), Some("hostname1"));
        assert_eq!(l.origin.pid, Some(25668));
        assert_eq!(l.origin.dev, Some(0));
        assert_eq!(l.msg, "Using network IB");
    }

    #[test]
    fn mpirun_tag_timestamp_and_empty_host_are_handled() {
        let l = nccl("[3] node2:22556:22556 [1] NCCL INFO Connected all trees");
        assert_eq!(l.origin.host.as_deref(), Some("node2"));
        assert_eq!(l.origin.dev, Some(1));
        let l = nccl("[2025-07-21 19:05:29] node004:27907:27907 [1] transport/nvls.cc:254 NCCL WARN Cuda failure 401");
        assert_eq!(l.level, Level::Warn);
        assert_eq!(l.origin.host.as_deref(), Some("node004"));
        assert_eq!(l.origin.dev, Some(1));
        let l = nccl("::16674:17023 [0] NCCL INFO Using network IB");
        assert_eq!(l.origin.host.as_deref(), Some(""));
        assert_eq!(l.origin.pid, Some(16674));
    }

    #[test]
    fn bare_and_blank_lines() {
        let l = nccl("NCCL version 2.20.5+cuda12.4");
        assert_eq!(l.level, Level::Bare);
        assert_eq!(l.origin, Origin::default());
        assert_eq!(split("   "), Kind::Other);
    }
}
