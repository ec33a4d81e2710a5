//! [`Calibration`]: measured thresholds the planner consults, loaded from a JSON file
//! ([`Calibration::load`]) or the file named by `GDX_CALIBRATION` ([`Calibration::from_env`]).
//!
//! A calibration never makes the planner take a path that does not exist; it only chooses
//! between paths that do ("below 64 KiB, staged beat p2p on this machine") and tunes the
//! staged pipeline and the p2p stream split. Every plan it changes names the calibration in
//! its reason, so the choice stays visible.
//!
//! ```json
//! { "schema_version": 1, "source": "gdx bench on h200-a, 2026-11-30",
//!   "crossovers": [ { "below_bytes": 65536, "prefer": "staged", "over": "p2p" } ],
//!   "staged_chunk_bytes": 16777216, "staged_depth": 4, "p2p_streams": 1 }
//! ```

use std::path::Path as FsPath;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::routing::plan::Path;

/// The variable naming a calibration file.
pub const CALIBRATION_ENV: &str = "GDX_CALIBRATION";

/// The schema version this build writes and reads.
pub const CALIBRATION_SCHEMA: u32 = 1;

/// One measured crossover: for transfers of fewer than `below_bytes` bytes, `prefer` was
/// faster than `over`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Crossover {
    /// The size below which `prefer` wins.
    pub below_bytes: u64,
    /// The path that wins below the threshold.
    pub prefer: Path,
    /// The path it beats.
    pub over: Path,
}

/// Thresholds and tuning from a calibration run (e.g. `gdx calibrate`, `gdx bench`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Calibration {
    /// Schema version; 0 (absent) is read as [`CALIBRATION_SCHEMA`].
    pub schema_version: u32,
    /// Where the numbers come from (tool, machine, date), quoted in plan reasons.
    pub source: Option<String>,
    /// Size crossovers between paths.
    pub crossovers: Vec<Crossover>,
    /// Chunk size of the staged pipeline, in bytes (default [`DEFAULT_STAGED_CHUNK`]).
    pub staged_chunk_bytes: Option<u64>,
    /// Number of pinned bounce buffers in flight in the staged pipeline (default
    /// [`DEFAULT_STAGED_DEPTH`]).
    pub staged_depth: Option<u32>,
    /// Streams (copy engines) a large p2p copy is split over (default 1: on the H200 test
    /// machine splitting did not help at 1 GiB and hurt at 8 MiB).
    pub p2p_streams: Option<u32>,
    /// Smallest transfer that is split over `p2p_streams` streams.
    pub p2p_split_min_bytes: Option<u64>,
}

/// Ops of at most this many bytes take the mailbox when one runs and no calibration says
/// otherwise (measured on the H200 test machine; `gdx calibrate` measures it per machine).
pub const DEFAULT_MAILBOX_CROSSOVER: u64 = gdx_sys::cuda::mailbox::DEFAULT_CROSSOVER as u64;

/// Default staged chunk: 16 MiB.
pub const DEFAULT_STAGED_CHUNK: u64 = 16 << 20;
/// Default staged depth: 4 bounce buffers.
pub const DEFAULT_STAGED_DEPTH: u32 = 4;

impl Calibration {
    /// Read a calibration file (JSON).
    pub fn load(path: impl AsRef<FsPath>) -> Result<Calibration> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidArgument(format!("cannot read calibration {}: {e}", path.display()))
        })?;
        let mut cal: Calibration = serde_json::from_str(&text).map_err(|e| {
            Error::InvalidArgument(format!("bad calibration {}: {e}", path.display()))
        })?;
        if cal.schema_version > CALIBRATION_SCHEMA {
            return Err(Error::InvalidArgument(format!(
                "calibration {} has schema version {}; this build reads up to {CALIBRATION_SCHEMA}",
                path.display(),
                cal.schema_version
            )));
        }
        if cal.source.is_none() {
            cal.source = Some(path.display().to_string());
        }
        Ok(cal)
    }

    /// The file named by `GDX_CALIBRATION`, or `None` when the variable is unset or empty.
    pub fn from_env() -> Result<Option<Calibration>> {
        match std::env::var(CALIBRATION_ENV) {
            Ok(p) if !p.is_empty() => Calibration::load(p).map(Some),
            _ => Ok(None),
        }
    }

    /// Write as pretty JSON.
    pub fn save(&self, path: impl AsRef<FsPath>) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode calibration: {e}")))?;
        std::fs::write(path.as_ref(), text).map_err(|e| Error::os("write", e))
    }

    /// The crossover saying `prefer` beats `over` at `len` bytes, if any.
    pub fn prefers(&self, prefer: Path, over: Path, len: u64) -> Option<&Crossover> {
        self.crossovers
            .iter()
            .find(|c| c.prefer == prefer && c.over == over && len < c.below_bytes)
    }

    /// Staged chunk size in bytes (at least 4 KiB).
    pub fn staged_chunk(&self) -> u64 {
        self.staged_chunk_bytes
            .unwrap_or(DEFAULT_STAGED_CHUNK)
            .max(4096)
    }

    /// Staged pipeline depth (2 to 16).
    pub fn staged_depth(&self) -> u32 {
        self.staged_depth
            .unwrap_or(DEFAULT_STAGED_DEPTH)
            .clamp(2, 16)
    }

    /// Streams to split a `len`-byte p2p copy over (1 to 8).
    pub fn p2p_streams_for(&self, len: u64) -> u32 {
        let n = self.p2p_streams.unwrap_or(1).clamp(1, 8);
        match self.p2p_split_min_bytes {
            Some(min) if len < min => 1,
            _ => n,
        }
    }

    /// The mailbox crossover for `over` (`HostToGpu` or `GpuToHost`): ops of at most the
    /// returned many bytes take the mailbox. From a `{prefer: mailbox, over}` crossover, else
    /// [`DEFAULT_MAILBOX_CROSSOVER`]; the text says which.
    pub fn mailbox_crossover(&self, over: Path) -> (u64, String) {
        match self
            .crossovers
            .iter()
            .find(|c| c.prefer == Path::Mailbox && c.over == over)
        {
            Some(c) => (c.below_bytes.saturating_sub(1), self.name().to_string()),
            None => (DEFAULT_MAILBOX_CROSSOVER, "default".to_string()),
        }
    }

    /// How the calibration is named in plan reasons.
    pub(crate) fn name(&self) -> &str {
        self.source.as_deref().unwrap_or("calibration")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_round_trips_and_defaults_fill_in() {
        let dir = std::env::temp_dir().join(format!("gdx-cal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("cal.json");
        std::fs::write(
            &f,
            r#"{"crossovers":[{"below_bytes":4096,"prefer":"staged","over":"p2p"}]}"#,
        )
        .unwrap();
        let cal = Calibration::load(&f).unwrap();
        assert_eq!(cal.crossovers.len(), 1);
        assert_eq!(
            cal.source.as_deref(),
            Some(f.display().to_string().as_str())
        );
        assert_eq!(cal.staged_chunk(), DEFAULT_STAGED_CHUNK);
        assert_eq!(cal.staged_depth(), DEFAULT_STAGED_DEPTH);
        assert!(cal.prefers(Path::Staged, Path::P2p, 100).is_some());
        assert!(cal.prefers(Path::Staged, Path::P2p, 4096).is_none());
        cal.save(dir.join("again.json")).unwrap();
        let again = Calibration::load(dir.join("again.json")).unwrap();
        assert_eq!(again.crossovers, cal.crossovers);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn newer_schemas_and_bad_json_are_refused_with_the_file_name() {
        let dir = std::env::temp_dir().join(format!("gdx-cal-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("new.json");
        std::fs::write(&f, r#"{"schema_version": 99}"#).unwrap();
        assert!(Calibration::load(&f)
            .unwrap_err()
            .to_string()
            .contains("schema version 99"));
        std::fs::write(&f, "not json").unwrap();
        assert!(Calibration::load(&f)
            .unwrap_err()
            .to_string()
            .contains("new.json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_mailbox_crossover_comes_from_the_calibration_or_the_default() {
        let d = Calibration::default();
        assert_eq!(
            d.mailbox_crossover(Path::HostToGpu),
            (DEFAULT_MAILBOX_CROSSOVER, "default".to_string())
        );
        let cal = Calibration {
            source: Some("cal.json".into()),
            crossovers: vec![Crossover {
                below_bytes: 4097,
                prefer: Path::Mailbox,
                over: Path::GpuToHost,
            }],
            ..Calibration::default()
        };
        assert_eq!(
            cal.mailbox_crossover(Path::GpuToHost),
            (4096, "cal.json".into())
        );
        assert_eq!(
            cal.mailbox_crossover(Path::HostToGpu).0,
            DEFAULT_MAILBOX_CROSSOVER
        );
    }

    #[test]
    fn the_split_applies_only_above_its_threshold() {
        let cal = Calibration {
            p2p_streams: Some(4),
            p2p_split_min_bytes: Some(1 << 20),
            ..Calibration::default()
        };
        assert_eq!(cal.p2p_streams_for(1 << 19), 1);
        assert_eq!(cal.p2p_streams_for(1 << 30), 4);
        assert_eq!(Calibration::default().p2p_streams_for(1 << 30), 1);
    }
}
