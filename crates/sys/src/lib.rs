//! gdx-sys: run-time loading of the vendor libraries gdx uses (libcuda, NVML, libibverbs,
//! cuFile, NCCL, libfabric) and safe types over them, and nothing else. Every entry point
//! returns either a working handle or a typed [`Unavailable`] saying which library and why;
//! nothing here panics when a library or a symbol is missing.
//!
//! | module | library | entry point |
//! |---|---|---|
//! | [`cuda`] | `libcuda.so.1` (driver API) | [`cuda::Cuda::load`] |
//! | [`nvml`] | `libnvidia-ml.so.1` | [`nvml::Nvml::load`], [`nvml::snapshot`] |
//! | [`verbs`] | `libibverbs.so.1` | [`verbs::probe`], [`verbs::devices`] |
//! | [`cufile`] | `libcufile.so.0` | [`cufile::probe`] |
//! | [`nccl`] | `libnccl.so.2` | [`nccl::probe`] |
//! | [`fabric`] | `libfabric.so.1` | [`fabric::Libfabric::load`] |
//!
//! [`libraries`] summarises the first five for the headers of `gdx topo` and `gdx doctor`
//! (libfabric is reported by gdx-fabric's `library`, with its providers).
//!
//! [`timer`] is the one timer that reads either the host's clock or CUDA events on streams
//! (chosen at run time), beside the events it records.
//!
//! [`os`] holds the few POSIX calls rustix (the workspace's syscall crate) lacks. What every
//! crate shares and that needs no vendor library (byte sizes, the test pattern, statistics,
//! test preconditions) is gdx-base's.
//!
//! # Library dependency
//!
//! A binary using this crate links none of these libraries: each is opened with `dlopen` when
//! first asked for, so one binary runs both on a GPU machine and on a machine with none of
//! them. libcuda and NVML are tried under every name the wrappers (cudarc, nvml-wrapper) would
//! try, then in the driver's usual directories; cuFile and NCCL also in the CUDA toolkit's
//! directories (`$CUDA_HOME`, `/usr/local/cuda`); libfabric also where the EFA installer puts
//! it (`/opt/amazon/efa`). libibverbs is the exception: rdma-mummy-sys (under sideway) links a
//! small static shim whose constructor opens `libibverbs.so.1` at process start and leaves its
//! function pointers null when that fails; [`verbs`] checks the same soname before calling
//! through it.
//!
//! # Caching and unloading
//!
//! The default loaders ([`cuda::Cuda::load`], [`nvml::Nvml::load`], [`verbs::probe`],
//! [`cufile::probe`], [`nccl::probe`], [`fabric::Libfabric::load`]) run once per process and
//! return the cached result, success or failure, afterwards. The `*_from` variants take an
//! explicit candidate list and are not cached. A library that was opened is never closed.
//!
//! # Thread safety
//!
//! All handles are `Send + Sync` and cheap to clone (libfabric's objects come in `Arc`s).
//!
//! # Not cudarc's loader
//!
//! cudarc's `dynamic-loading` functions panic when libcuda or one of its symbols is missing
//! (`panic_no_lib_found`, and `load()` resolving each symbol with a panic on first use). This
//! crate uses cudarc only for its CUDA 13.0 type definitions and constants; every driver call
//! goes through [`cuda`]'s own table of checked function pointers. Code above `gdx-sys` must
//! not call `cudarc::driver::{sys, result, safe}` functions.

#![deny(missing_docs)]
// Lints: [workspace.lints] in the root Cargo.toml (unsafe contracts, no unwrap/expect/panic).

mod loader;

pub mod cuda;
pub mod cufile;
pub mod fabric;
pub mod nccl;
pub mod nvml;
pub mod os;
pub mod timer;
pub mod verbs;

/// A vendor library that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{library} unavailable: {reason}")]
pub struct Unavailable {
    /// Library name, e.g. `libnvidia-ml.so.1`.
    pub library: String,
    /// Why: every soname tried and the loader's message, or the init call that failed.
    pub reason: String,
}

impl Unavailable {
    /// An `Unavailable` for `library` with `reason`.
    pub fn new(library: impl Into<String>, reason: impl Into<String>) -> Self {
        Unavailable {
            library: library.into(),
            reason: reason.into(),
        }
    }
}

/// One vendor library as [`libraries`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryStatus {
    /// Canonical soname, e.g. `libcuda.so.1`.
    pub name: &'static str,
    /// The file the loader mapped; `None` when unavailable.
    pub path: Option<String>,
    /// Version text, e.g. `CUDA 13.0`, `driver 580.159.04`, `rdma-core 50.0`, `1.15.0`,
    /// `2.28.3`; `None` when unavailable or not reported.
    pub version: Option<String>,
    /// Why the library is unavailable; `None` when it loaded.
    pub reason: Option<String>,
}

impl LibraryStatus {
    /// Whether the library loaded.
    pub fn is_available(&self) -> bool {
        self.reason.is_none()
    }

    fn from_result<T>(
        name: &'static str,
        result: Result<T, Unavailable>,
        describe: impl FnOnce(&T) -> (String, Option<String>),
    ) -> Self {
        match result {
            Ok(v) => {
                let (path, version) = describe(&v);
                LibraryStatus {
                    name,
                    path: Some(path),
                    version,
                    reason: None,
                }
            }
            Err(e) => LibraryStatus {
                name,
                path: None,
                version: None,
                reason: Some(e.reason),
            },
        }
    }
}

/// The state of every vendor library gdx uses, in a fixed order: libcuda, NVML, libibverbs,
/// cuFile, NCCL. Loads each through its cached default loader; never fails.
pub fn libraries() -> Vec<LibraryStatus> {
    vec![
        LibraryStatus::from_result(cuda::SONAME, cuda::Cuda::load(), |c| {
            let version = c.driver_version().ok().map(|v| format!("CUDA {v}"));
            (c.path().to_string(), version)
        }),
        LibraryStatus::from_result(nvml::SONAME, nvml::Nvml::load(), |n| {
            let version = n.driver_version().ok().map(|v| format!("driver {v}"));
            (n.path().to_string(), version)
        }),
        LibraryStatus::from_result(verbs::SONAME, verbs::probe(), |v| {
            let version = v
                .rdma_core_version
                .as_ref()
                .map(|r| format!("rdma-core {r}"));
            (v.path.clone(), version)
        }),
        LibraryStatus::from_result(cufile::SONAME, cufile::probe(), |c| {
            (c.path.clone(), c.version.map(|v| v.to_string()))
        }),
        LibraryStatus::from_result(nccl::SONAME, nccl::probe(), |n| {
            (n.path.clone(), n.version.map(|v| v.to_string()))
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_lists_all_five_each_either_loaded_or_explained() {
        let libs = libraries();
        let names: Vec<_> = libs.iter().map(|l| l.name).collect();
        assert_eq!(
            names,
            [
                "libcuda.so.1",
                "libnvidia-ml.so.1",
                "libibverbs.so.1",
                "libcufile.so.0",
                "libnccl.so.2"
            ]
        );
        for l in &libs {
            eprintln!("{l:?}");
            match (&l.path, &l.reason) {
                (Some(p), None) => assert!(!p.is_empty(), "{l:?}"),
                (None, Some(r)) => assert!(!r.is_empty(), "{l:?}"),
                _ => panic!("exactly one of path and reason must be set: {l:?}"),
            }
            assert_eq!(l.is_available(), l.path.is_some());
        }
    }

    #[test]
    fn binary_links_no_vendor_library() {
        // Every vendor library is opened at run time; the test binary itself must not need one.
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("ldd").arg(&exe).output();
        if !gdx_base::testenv::precondition("ldd", out.is_ok()) {
            return;
        }
        let out = out.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("libc.so"), "unexpected ldd output: {text}");
        for lib in [
            "libcuda",
            "libnvidia-ml",
            "libibverbs",
            "librdmacm",
            "libmlx5",
            "libcufile",
            "libnccl",
            "libfabric",
        ] {
            assert!(
                !text.contains(lib),
                "{lib} is a link-time dependency:\n{text}"
            );
        }
    }

    #[test]
    fn unavailable_displays_library_and_reason() {
        let u = Unavailable::new("libx.so.1", "tried 1 candidate(s); not found: libx.so.1");
        assert_eq!(
            u.to_string(),
            "libx.so.1 unavailable: tried 1 candidate(s); not found: libx.so.1"
        );
    }
}
