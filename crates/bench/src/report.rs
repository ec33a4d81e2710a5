//! The result data and its stable exports: [`Report`] (header, per-case outcomes, per-size
//! rows) serialised as JSON (schema in `docs/bench/README.md`, [`SCHEMA_VERSION`]) and CSV.
//!
//! JSON uses numbers and `null`, never "N/A" strings. Units are in the field names: bytes,
//! seconds (`_s`), microseconds (`_us`), GB/s (`_gbps`, 1e9 bytes per second).

use serde::{Deserialize, Serialize};

use crate::spec::{CaseSpec, End, PathKind};

/// The version of the JSON shape; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Outcome of a case or of one size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Measured (and verified, unless verification was off).
    Passed,
    /// Not runnable here; the reason is in `reason` / `note`.
    Waived,
    /// Failed; the message is in `reason` / `note`.
    Error,
}

/// One measured size of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Case key, e.g. `gpu0_to_gpu1_p2p`.
    pub key: String,
    /// Path name, e.g. `p2p`.
    pub path: PathKind,
    /// Source (`host`, `gpu0`, `remote:HOST:PORT`).
    pub src: String,
    /// Destination.
    pub dst: String,
    /// Both directions at once; `bw_gbps` is then the total.
    pub bidir: bool,
    /// Bytes per transfer (per direction when `bidir`).
    pub size_bytes: u64,
    /// Median bandwidth, GB/s (1e9 B/s).
    pub bw_gbps: Option<f64>,
    /// Message rate at the median bandwidth, millions of transfers per second (perftest's
    /// MsgRate): `bw_gbps × 1000 / size_bytes`, counting both directions when `bidir`.
    #[serde(default)]
    pub msg_rate_mops: Option<f64>,
    /// Lowest and highest bandwidth of the samples.
    pub bw_min_gbps: Option<f64>,
    /// Highest bandwidth of the samples.
    pub bw_max_gbps: Option<f64>,
    /// Median latency of one transfer as the host sees it, µs.
    pub lat_p50_us: Option<f64>,
    /// 99th percentile latency, µs.
    pub lat_p99_us: Option<f64>,
    /// Process CPU time (user + system) per GB moved during the timed loop, seconds.
    pub cpu_s_per_gb: Option<f64>,
    /// Highest NVML GPU utilisation of the GPUs involved, sampled after the timed loop, %.
    pub gpu_util_pct: Option<f64>,
    /// The topology ceiling for this path, GB/s.
    pub ceiling_gbps: Option<f64>,
    /// What the ceiling is based on (`NV18 x 26.56 GB/s`, `PCIe Gen5 x16`).
    pub ceiling_basis: Option<String>,
    /// `bw_gbps` as a percentage of `ceiling_gbps`.
    pub pct_of_ceiling: Option<f64>,
    /// Timed iterations (transfers) behind the bandwidth figure.
    pub iters: u64,
    /// Seconds per transfer of each bandwidth sample.
    pub samples_s: Vec<f64>,
    /// Seconds of each latency sample.
    pub lat_samples_s: Vec<f64>,
    /// `Some(true)` verified, `Some(false)` mismatch, `None` not checked.
    pub verified: Option<bool>,
    /// Passed, or Error (this size failed).
    pub status: Status,
    /// Method details, warnings and likely causes.
    pub note: Option<String>,
    /// Host latency rows: the floor measured interleaved with the row's samples, and the
    /// row against it ([`crate::floors::NearFloor`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_near: Option<NearFloor>,
    /// Batch rows of at least [`crate::copyref::MIN_BYTES`] per transfer: a single-thread
    /// memcpy of the same bytes measured interleaved with the row's samples, and the row
    /// against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_near: Option<NearCopy>,
    /// RDMA rows: what the local port's loss and congestion counters (`hw_counters`,
    /// `counters`) did during the row's operations, each moving counter named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic_counters: Option<gdx_topo::sysfs::counters::CounterDeltas>,
    /// The rails of a tcp row's peer connection: the bytes the row's transfers moved over
    /// each, and each rail's state after them (`cause` while paused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<RailRow>,
}

/// One rail of a row ([`Row::rails`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RailRow {
    /// This side's end (a local address, or a device).
    pub local: String,
    /// The peer's end.
    pub remote: String,
    /// Bytes the row's transfers moved over it.
    pub bytes: u64,
    /// `active` or `paused`.
    pub state: String,
    /// Why it is paused.
    pub cause: Option<String>,
}

impl Row {
    /// An empty row for `spec` at `size` (status passed, no figures yet).
    pub fn new(spec: &CaseSpec, size: u64) -> Row {
        Row {
            key: spec.key.clone(),
            path: spec.path,
            src: spec.src.name(),
            dst: spec.dst.name(),
            bidir: spec.bidir,
            size_bytes: size,
            bw_gbps: None,
            msg_rate_mops: None,
            bw_min_gbps: None,
            bw_max_gbps: None,
            lat_p50_us: None,
            lat_p99_us: None,
            cpu_s_per_gb: None,
            gpu_util_pct: None,
            ceiling_gbps: None,
            ceiling_basis: None,
            pct_of_ceiling: None,
            iters: 0,
            samples_s: Vec::new(),
            lat_samples_s: Vec::new(),
            verified: None,
            status: Status::Passed,
            note: None,
            floor_near: None,
            copy_near: None,
            rails: Vec::new(),
            nic_counters: None,
        }
    }

    /// An error row for one size.
    pub fn failed(spec: &CaseSpec, size: u64, msg: impl Into<String>) -> Row {
        Row {
            status: Status::Error,
            note: Some(msg.into()),
            ..Row::new(spec, size)
        }
    }

    /// Append a note, separated by `; `.
    pub fn add_note(&mut self, text: impl AsRef<str>) {
        let t = text.as_ref();
        match &mut self.note {
            Some(n) if !n.is_empty() => {
                n.push_str("; ");
                n.push_str(t);
            }
            _ => self.note = Some(t.to_string()),
        }
    }

    /// Whether the row counts as a failure for the exit code.
    pub fn is_failure(&self) -> bool {
        self.status == Status::Error || self.verified == Some(false)
    }
}

/// Outcome of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseOutcome {
    /// Case key.
    pub key: String,
    /// What it measures.
    pub description: String,
    /// Path name.
    pub path: PathKind,
    /// Source.
    pub src: String,
    /// Destination.
    pub dst: String,
    /// Passed, Waived or Error.
    pub status: Status,
    /// The waiver's reason or the error's message.
    pub reason: Option<String>,
    /// Wall time the case took, seconds.
    pub elapsed_s: f64,
}

impl CaseOutcome {
    /// The outcome skeleton for `spec`.
    pub fn new(spec: &CaseSpec, status: Status, reason: Option<String>, elapsed_s: f64) -> Self {
        CaseOutcome {
            key: spec.key.clone(),
            description: spec.description.clone(),
            path: spec.path,
            src: End::name(&spec.src),
            dst: End::name(&spec.dst),
            status,
            reason,
            elapsed_s,
        }
    }
}

/// Cases waived for one shared reason (no CUDA driver, a GPU that is not there, no RDMA
/// device), reported once instead of once per case. Those cases are not in
/// [`Report::cases`]: on a machine without a GPU they would be invented (`gpu0`, `gpu1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaivedGroup {
    /// Which cases: `GPU cases`, `GPU1 cases`, `RDMA cases`.
    pub scope: String,
    /// Why, short.
    pub reason: String,
    /// The full loader or discovery message, once.
    pub detail: Option<String>,
    /// What to do about it.
    pub fix: Option<String>,
    /// How many selected cases it waived.
    pub cases: usize,
}

/// How the figures were taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Method {
    /// The protocol in words.
    pub description: String,
    /// Untimed warm-up transfers per size.
    pub warmup: u32,
    /// Target timed duration per size, seconds.
    pub duration_s: f64,
    /// Fewest samples per size.
    pub min_samples: u32,
    /// Most samples per size.
    pub max_samples: u32,
    /// Fixed iteration count, when given.
    pub iters: Option<u32>,
    /// Whether destinations were verified.
    pub verify: bool,
    /// Buffers rotate over this many bytes for smaller sizes.
    pub rotate_bytes: u64,
    /// Unit of bandwidth figures.
    pub bandwidth_unit: String,
}

/// One device named in the header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceDesc {
    /// `GPU0`.
    pub label: String,
    /// Product name.
    pub name: Option<String>,
    /// PCI address.
    pub bdf: Option<String>,
    /// NUMA node.
    pub numa: Option<u32>,
}

/// Where and how the run happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always `gdx`.
    pub tool: String,
    /// gdx version.
    pub gdx_version: String,
    /// Git commit the binary was built from, when known.
    pub git_hash: Option<String>,
    /// Host name.
    pub host: String,
    /// CPU model and logical CPU count.
    pub cpu: String,
    /// Kernel release.
    pub kernel: Option<String>,
    /// Start time, seconds since the Unix epoch (UTC).
    pub started_unix_s: u64,
    /// The command line.
    pub command_line: Vec<String>,
    /// CUDA driver version and library, or why CUDA is unavailable.
    pub cuda: Option<String>,
    /// NVIDIA driver version (NVML), when available.
    pub driver: Option<String>,
    /// GPUs and NICs.
    pub devices: Vec<DeviceDesc>,
    /// The measurement protocol.
    pub method: Method,
    /// Anything else worth knowing (topology notes, mock backend in use).
    pub notes: Vec<String>,
    /// The host ceiling and how it was measured, when host cases ran.
    #[serde(default)]
    pub host_ceiling: Option<HostCeiling>,
    /// The host latency floors of this run, when host cases ran.
    #[serde(default)]
    pub latency_floors: Option<LatencyFloors>,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Machine, version, command line, method.
    pub header: Header,
    /// One per selected case, in run order, except those in `waived`.
    pub cases: Vec<CaseOutcome>,
    /// Cases waived for a shared reason, one entry per reason.
    #[serde(default)]
    pub waived: Vec<WaivedGroup>,
    /// One per case and size.
    pub results: Vec<Row>,
}

impl Report {
    /// Pretty JSON.
    ///
    /// # Errors
    /// Only if serialisation fails (it does not for these types).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// Parse a report written by [`Report::to_json`].
    ///
    /// # Errors
    /// The parse error, or a schema version this build does not read.
    pub fn from_json(text: &str) -> Result<Report, ReportError> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(ReportError::NotJson)?;
        let ver = v.get("schema_version").and_then(serde_json::Value::as_u64);
        match ver {
            Some(n) if n == u64::from(SCHEMA_VERSION) => {}
            Some(n) => return Err(ReportError::Schema(n)),
            None => return Err(ReportError::NoSchema),
        }
        serde_json::from_value(v).map_err(ReportError::Shape)
    }

    /// CSV with a header line; one line per row, no raw samples.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(CSV_HEADER);
        out.push('\n');
        for r in &self.results {
            let line: Vec<String> = r.export_fields().iter().map(|s| csv_field(s)).collect();
            out.push_str(&line.join(","));
            out.push('\n');
        }
        out
    }

    /// The same columns as [`Report::to_csv`] as a Markdown table, under a line naming the
    /// machine and the gdx build — for pasting into BENCHMARKS.md or an issue.
    pub fn to_markdown(&self) -> String {
        let h = &self.header;
        let mut out = format!(
            "gdx bench on {} ({}), gdx {}\n\n",
            h.host, h.cpu, h.gdx_version
        );
        let cols: Vec<&str> = CSV_HEADER.split(',').collect();
        out.push_str(&format!("| {} |\n", cols.join(" | ")));
        out.push_str(&format!("|{}\n", "---|".repeat(cols.len())));
        for r in &self.results {
            let cells: Vec<String> = r.export_fields().iter().map(|s| md_cell(s)).collect();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out
    }

    /// Whether any case or row failed (exit code 1).
    pub fn has_failures(&self) -> bool {
        self.cases.iter().any(|c| c.status == Status::Error)
            || self.results.iter().any(Row::is_failure)
    }
}

/// Why a file is not a report this build reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// JSON without `schema_version`.
    #[error("no schema_version: not a gdx bench report")]
    NoSchema,
    /// Another schema version.
    #[error("schema_version {0} is not {SCHEMA_VERSION}, the one this gdx reads")]
    Schema(u64),
    /// The right version, the wrong shape.
    #[error("not a gdx bench report: {0}")]
    Shape(#[source] serde_json::Error),
}

/// The CSV columns, in order.
pub const CSV_HEADER: &str = "key,path,src,dst,bidir,size_bytes,bw_gbps,msg_rate_mops,lat_p50_us,lat_p99_us,cpu_s_per_gb,gpu_util_pct,ceiling_gbps,pct_of_ceiling,iters,verified,status,note";

impl Row {
    /// The exported columns, in [`CSV_HEADER`]'s order (one list for CSV and Markdown).
    fn export_fields(&self) -> [String; 18] {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.6}")).unwrap_or_default();
        [
            self.key.clone(),
            self.path.name().to_string(),
            self.src.clone(),
            self.dst.clone(),
            self.bidir.to_string(),
            self.size_bytes.to_string(),
            f(self.bw_gbps),
            f(self.msg_rate_mops),
            f(self.lat_p50_us),
            f(self.lat_p99_us),
            f(self.cpu_s_per_gb),
            f(self.gpu_util_pct),
            f(self.ceiling_gbps),
            f(self.pct_of_ceiling),
            self.iters.to_string(),
            self.verified.map(|b| b.to_string()).unwrap_or_default(),
            format!("{:?}", self.status).to_lowercase(),
            self.note.clone().unwrap_or_default(),
        ]
    }
}

/// A Markdown table cell: `|` escaped, line breaks folded (a note may hold either).
fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Quote a CSV field when it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

// The measured references a row or header carries (their producers: `floors.rs`,
// `copyref.rs`, `hostceil.rs`, which re-export them).

/// One measured point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CeilingPoint {
    /// Source bytes, split over the threads.
    pub working_set_bytes: u64,
    /// Threads copying at once.
    pub threads: usize,
    /// Best batch, GB/s (1e9 B/s) of bytes copied.
    pub gbps: f64,
}

/// The host ceiling of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCeiling {
    /// The method, in words (printed in the header).
    pub method: String,
    /// Best figure with a 256 MiB working set, GB/s: the ceiling of rows of 16 MiB or more (`hostceil::DRAM_FROM_BYTES`).
    pub dram_gbps: f64,
    /// Best figure of every point, GB/s: the ceiling of smaller rows.
    pub cache_gbps: f64,
    /// Every point measured.
    pub points: Vec<CeilingPoint>,
}

/// A batch row against the memcpy of the same bytes measured between its blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NearCopy {
    /// Bytes per transfer (and per reference copy).
    pub bytes: u64,
    /// Median of the copy blocks' p50 bandwidth, GB/s.
    pub copy_gbps: f64,
    /// Median over the blocks of (the block's bandwidth / its copy block's): the row's
    /// fraction of memcpy.
    pub ratio: f64,
    /// Smallest block ratio.
    pub ratio_min: f64,
    /// Largest block ratio.
    pub ratio_max: f64,
    /// Blocks paired.
    pub blocks: u32,
}

/// The floors of one run, p50 round trip in µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyFloors {
    /// Shared-memory flag round trip.
    pub shm_flag_us: f64,
    /// Unix-socket 8-byte round trip.
    pub unix_us: Option<f64>,
    /// TCP loopback 8-byte round trip (`TCP_NODELAY`).
    pub tcp_us: Option<f64>,
    /// How they were measured, in words.
    pub method: String,
}

/// A floor measured beside one host latency row, interleaved with it: before each block of
/// `floors::BLOCK_OPS` transfers, `floors::BLOCK_TRIPS` round trips of the row's floor (the shm flag for
/// shm rows, tcp loopback for tcp rows). Each block's p50 is judged against the floor block
/// measured just before it, so a figure and its reference share the machine's state: on a
/// small VM the two vCPUs may sit on one physical core's hyperthreads, on two cores, or on
/// one time-shared CPU, and the run-wide floor (measured once, at the start) may have been
/// taken in another of those states than the row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NearFloor {
    /// Median of the floor blocks' p50s, µs.
    pub floor_us: f64,
    /// Median over the blocks of (block p50 / its floor block's p50).
    pub ratio: f64,
    /// Smallest and largest block ratio.
    pub ratio_min: f64,
    /// Largest block ratio.
    pub ratio_max: f64,
    /// Blocks paired.
    pub blocks: u32,
}

/// Marks a row whose p50 is one window of transfers, not one transfer (the latency floors
/// are not set beside it).
pub const WINDOW_NOTE: &str = "window of transfers";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv_field("abc"), "abc");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    }

    #[test]
    fn reports_without_a_known_schema_are_refused() {
        assert!(matches!(
            Report::from_json("{}"),
            Err(ReportError::NoSchema)
        ));
        assert!(matches!(
            Report::from_json("{\"schema_version\": 99}"),
            Err(ReportError::Schema(99))
        ));
        assert!(Report::from_json("nope")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
    }
}
