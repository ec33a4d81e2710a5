//! The `file` cases: file → GPU, GPU → file and file → host through `gdx-storage`, over each
//! storage path (`gds`, `file-staged`) and the naive `read()` + `cudaMemcpy` baseline, with the
//! page cache dropped (`posix_fadvise(DONTNEED)` before each read sample) or bypassed
//! (`O_DIRECT`), and every write `fdatasync`ed inside the timing: the figures are the disk's,
//! and each row's note says how the page cache was handled.
//!
//! The measuring is [`rows::measure`] (the file-benchmark protocol over gdx-storage's movers),
//! one call per size; this module turns its rows into [`Row`]s.
//!
//! Opt-in ([`BenchCase::opt_in`]): they write scratch files as large as the largest size, so a
//! plain `gdx bench` leaves them out; `gdx bench --path file` runs them. The scratch files go to
//! [`scratch_dir`] and are removed after each size.
//!
//! Keys: `file_to_host_file_staged`, `file_to_gpu<N>_{gds,file_staged,naive}`,
//! `gpu<N>_to_file_{gds,file_staged,naive}`. The GPU cases are waived (with the reason) without
//! a GPU, the `gds` ones where cuFile cannot run; file → host runs anywhere.

use std::path::PathBuf;

pub mod rows;

use gdx_storage::CufileStatus;
use rows::{measure, FileRow, Kind, Options, Outcome};

use crate::case::{BenchCase, CaseSpec, End, Params, PathKind, Waived};
use crate::error::BenchError;
use crate::report::{Row, Status};
use crate::Ctx;

/// Environment variable naming the scratch directory when `--file-dir` is not given.
pub const DIR_ENV: &str = "GDX_BENCH_DIR";

/// Where the scratch files go: `ctx.file_dir` (`--file-dir`), else `$GDX_BENCH_DIR`, else the
/// system temp dir. Put it on the disk to be measured (a tmpfs measures memory, and refuses
/// `O_DIRECT`: the rows then say `buffered`).
pub fn scratch_dir(ctx: &Ctx) -> PathBuf {
    ctx.file_dir
        .clone()
        .or_else(|| std::env::var_os(DIR_ENV).map(PathBuf::from))
        .unwrap_or_else(std::env::temp_dir)
}

/// One file case: a [`Kind`] on one GPU.
struct FileCase {
    spec: CaseSpec,
    kind: Kind,
    gpu: u32,
}

/// The file cases for GPUs `0..gpus` (file → host once, then per GPU file → GPU and GPU → file).
pub fn cases(gpus: u32) -> Vec<Box<dyn BenchCase>> {
    let mut v: Vec<Box<dyn BenchCase>> = Vec::new();
    for kind in Kind::ALL {
        let gpu_list: Vec<u32> = if kind.needs_gpu() {
            (0..gpus).collect()
        } else {
            vec![0]
        };
        for gpu in gpu_list {
            v.push(Box::new(FileCase::new(kind, gpu)));
        }
    }
    v
}

impl FileCase {
    fn new(kind: Kind, gpu: u32) -> FileCase {
        let path = kind.path().replace('-', "_");
        let (src, dst, key, what) = match kind {
            Kind::FileToHostStaged => (
                End::File,
                End::Host,
                "file_to_host_file_staged".to_string(),
                "file → host memory, O_DIRECT reads (page cache bypassed): the disk alone, no GPU"
                    .to_string(),
            ),
            k if k.key().starts_with("file_to_gpu") => (
                End::File,
                End::Gpu(gpu),
                format!("file_to_gpu{gpu}_{path}"),
                format!("file → GPU{gpu} over {}", describe(k)),
            ),
            k => (
                End::Gpu(gpu),
                End::File,
                format!("gpu{gpu}_to_file_{path}"),
                format!("GPU{gpu} → file over {}, fdatasync included", describe(k)),
            ),
        };
        FileCase {
            spec: CaseSpec {
                key,
                description: format!(
                    "{what}; page cache dropped or bypassed per sample (the note says which); \
                     opt-in: `--path file`, scratch files in --file-dir / ${DIR_ENV} / the temp dir"
                ),
                path: PathKind::File,
                src,
                dst,
                bidir: false,
            },
            kind,
            gpu,
        }
    }
}

fn describe(kind: Kind) -> &'static str {
    match kind.path() {
        "gds" => "cuFile (GPUDirect Storage, or its compatibility mode)",
        "naive" => {
            "the naive baseline (read()/write() of a pageable Vec + one synchronous cudaMemcpy)"
        }
        _ => "the O_DIRECT pipeline through pinned bounce buffers",
    }
}

impl BenchCase for FileCase {
    fn spec(&self) -> &CaseSpec {
        &self.spec
    }

    fn opt_in(&self) -> bool {
        true
    }

    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived> {
        if !self.kind.needs_gpu() {
            return Ok(());
        }
        // The disk alone (`file_to_host_file_staged`) still runs without a GPU.
        ctx.require_gpus(&[self.gpu])?;
        if self.kind.path() == "gds" {
            match gdx_storage::cufile_status().0 {
                CufileStatus::Available(_) => {}
                CufileStatus::Unavailable(why) => {
                    return Err(Waived::new(format!("cuFile cannot run: {why}")))
                }
                CufileStatus::NotNeeded => return Err(Waived::new("cuFile was not looked at")),
            }
        }
        Ok(())
    }

    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError> {
        let dir = scratch_dir(ctx);
        let file = dir.join(format!(
            "gdx-bench-{}-{}.scratch",
            self.spec.key,
            std::process::id()
        ));
        let samples = params
            .iters
            .unwrap_or(params.min_samples)
            .clamp(1, params.max_samples.max(1)) as usize;
        for &size in &params.sizes {
            let opts = Options {
                size,
                samples,
                ..Options::new(&file, self.gpu)
            };
            let got = measure(&opts, self.kind, &mut |m| log::debug!("{m}"));
            let _ = std::fs::remove_file(&file);
            let row = match got {
                Ok(r) => to_row(&self.spec, size, &r, &file),
                Err(e) => Row::failed(&self.spec, size, e.to_string()),
            };
            sink(row);
        }
        Ok(())
    }
}

/// A storage bench row as a bench [`Row`].
fn to_row(spec: &CaseSpec, size: u64, r: &FileRow, file: &std::path::Path) -> Row {
    let mut row = Row::new(spec, size);
    let good: Vec<f64> = r
        .samples_gbps
        .iter()
        .copied()
        .filter(|g| g.is_finite() && *g > 0.0)
        .collect();
    row.bw_gbps = r.median_gbps;
    row.bw_min_gbps = good.iter().copied().reduce(f64::min);
    row.bw_max_gbps = good.iter().copied().reduce(f64::max);
    row.samples_s = good.iter().map(|g| size as f64 / (g * 1e9)).collect();
    row.iters = r.samples_gbps.len() as u64;
    if !r.method.is_empty() {
        row.add_note(&r.method);
    }
    if !r.detail.is_empty() {
        row.add_note(format!("{} path: {}", r.path, r.detail));
    }
    row.add_note(format!(
        "scratch file {} (removed afterwards)",
        file.display()
    ));
    match &r.status {
        Outcome::Passed => {
            // `rows::measure` checks the first sample of every row against the pattern.
            row.verified = Some(true);
            row.add_note(if spec.dst == End::Host {
                "first sample verified (byte for byte against the pattern)"
            } else {
                "first sample verified (CRC-32 against the pattern)"
            });
        }
        Outcome::Waived(why) => {
            row.status = Status::Waived;
            row.add_note(format!("waived: {why}"));
        }
        Outcome::Error(e) => {
            row.status = Status::Error;
            if e.contains("verification failed") {
                row.verified = Some(false);
            }
            row.add_note(e);
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_opt_in() {
        let v = cases(1);
        let keys: Vec<&str> = v.iter().map(|c| c.spec().key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "file_to_host_file_staged",
                "file_to_gpu0_gds",
                "file_to_gpu0_file_staged",
                "file_to_gpu0_naive",
                "gpu0_to_file_gds",
                "gpu0_to_file_file_staged",
                "gpu0_to_file_naive",
            ]
        );
        assert!(v
            .iter()
            .all(|c| c.opt_in() && c.spec().path == PathKind::File));
    }

    #[test]
    fn without_a_gpu_the_gpu_cases_are_waived_and_file_to_host_runs() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = Ctx::without_devices();
        ctx.file_dir = Some(dir.path().to_path_buf());
        let params = Params {
            sizes: vec![64 << 10],
            ..Params::default()
        };
        for c in cases(1) {
            if c.spec().key == "file_to_host_file_staged" {
                assert!(c.applicable(&ctx).is_ok());
                let mut rows = Vec::new();
                c.run(&ctx, &params, &mut |r| rows.push(r)).unwrap();
                assert_eq!(rows.len(), 1);
                assert_eq!(rows[0].status, Status::Passed, "{:?}", rows[0].note);
                assert_eq!(rows[0].verified, Some(true));
                assert!(rows[0].bw_gbps.unwrap() > 0.0);
                assert!(rows[0].note.as_deref().unwrap().contains("page cache"));
            } else {
                let w = c.applicable(&ctx).unwrap_err();
                let cause = w.cause.as_ref().expect("a shared cause");
                assert_eq!(cause.scope, "GPU cases", "{w}");
                assert!(cause.reason.starts_with("no CUDA driver"), "{w}");
            }
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn default_selection_leaves_file_cases_out() {
        let ctx = Ctx::without_devices();
        let all = crate::select(crate::all_cases(&ctx), &[]).unwrap();
        assert!(all.iter().all(|c| c.spec().path != PathKind::File));
        let file = crate::select(crate::all_cases(&ctx), &["file".into()]).unwrap();
        assert!(!file.is_empty());
        assert!(file.iter().all(|c| c.spec().path == PathKind::File));
        let gpu0 = crate::select(crate::all_cases(&ctx), &["gpu0".into()]).unwrap();
        assert!(gpu0.iter().all(|c| c.spec().path != PathKind::File));
    }
}
