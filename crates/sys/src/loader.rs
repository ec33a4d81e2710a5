//! Opening vendor libraries and resolving their symbols without panicking.
//!
//! Invariants:
//! - [`open_first`] tries every candidate in order and keeps the first that the dynamic loader
//!   opens; when none opens, the [`Unavailable`] reason names every candidate and what the
//!   loader said about it.
//! - A library that was opened is never closed ([`Opened`] holds it in `ManuallyDrop`): vendor
//!   libraries start threads and keep state that must outlive any handle, and the function
//!   pointers resolved from them stay valid for the rest of the process.
//! - [`fn_table!`] builds a struct of typed function pointers; a missing required symbol is an
//!   error naming the symbol and the library, an optional one becomes `None`.

use crate::Unavailable;
use std::ffi::{c_void, CStr};
use std::mem::ManuallyDrop;

/// The loader message for a file that is not on the search path.
const NOT_FOUND: &str = "cannot open shared object file: No such file or directory";

/// Debian/Ubuntu multiarch directory for this target.
#[cfg(target_arch = "x86_64")]
const MULTIARCH: &str = "x86_64-linux-gnu";
#[cfg(target_arch = "aarch64")]
const MULTIARCH: &str = "aarch64-linux-gnu";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const MULTIARCH: &str = "unknown-linux-gnu";

/// CUDA toolkit `targets/<dir>` name for this target.
#[cfg(target_arch = "aarch64")]
const CUDA_TARGET: &str = "sbsa-linux";
#[cfg(not(target_arch = "aarch64"))]
const CUDA_TARGET: &str = "x86_64-linux";

/// Directories where the NVIDIA driver puts its user-space libraries (libcuda, NVML) when the
/// loader path does not list them.
pub(crate) fn driver_dirs() -> Vec<String> {
    vec![
        "/usr/local/nvidia/lib64".to_string(),
        format!("/usr/lib/{MULTIARCH}"),
        "/usr/lib64".to_string(),
        "/usr/lib/wsl/lib".to_string(),
    ]
}

/// Directories where a CUDA toolkit or distribution package puts cuFile and NCCL:
/// `$CUDA_HOME` and `$CUDA_PATH` first, then `/usr/local/cuda`, then the multiarch directory.
pub(crate) fn toolkit_dirs() -> Vec<String> {
    let mut roots: Vec<String> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .filter(|r| !r.is_empty())
        .collect();
    roots.push("/usr/local/cuda".to_string());
    let mut dirs = Vec::new();
    for root in roots {
        let root = root.trim_end_matches('/');
        dirs.push(format!("{root}/targets/{CUDA_TARGET}/lib"));
        dirs.push(format!("{root}/lib64"));
    }
    dirs.push(format!("/usr/lib/{MULTIARCH}"));
    dirs
}

/// Candidate list: the bare names (searched on the loader path) in order, then `soname` in each
/// of `dirs`; duplicates removed, order kept.
pub(crate) fn candidates(names: &[&str], soname: &str, dirs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let all = names
        .iter()
        .map(|n| n.to_string())
        .chain(dirs.iter().map(|d| format!("{d}/{soname}")));
    for c in all {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// A library the loader opened. It is never closed (see the module docs).
pub(crate) struct Opened {
    lib: ManuallyDrop<libloading::Library>,
    /// The candidate string that opened it (a bare soname or a path).
    pub(crate) candidate: String,
}

impl Opened {
    /// The open library.
    pub(crate) fn lib(&self) -> &libloading::Library {
        &self.lib
    }

    /// The file the loader mapped for this library, found through the address of one of its
    /// symbols (`dladdr`); the candidate string when that fails.
    pub(crate) fn file(&self, symbol_addr: *const c_void) -> String {
        file_of(symbol_addr).unwrap_or_else(|| self.candidate.clone())
    }
}

/// Open the first candidate the dynamic loader accepts. `library` names the library in the
/// [`Unavailable`] returned when none opens; its reason lists every candidate: the ones the
/// loader could not find, grouped, and any other loader message in full.
pub(crate) fn open_first<S: AsRef<str>>(
    library: &str,
    candidates: &[S],
) -> Result<Opened, Unavailable> {
    if candidates.is_empty() {
        return Err(Unavailable::new(
            library,
            "no candidate file names were given",
        ));
    }
    let mut not_found: Vec<&str> = Vec::new();
    let mut other: Vec<String> = Vec::new();
    for c in candidates {
        let c = c.as_ref();
        // SAFETY: loading a library runs its initialisers. The candidates are the vendor's own
        // sonames or paths given by the caller; running their initialisers is what loading
        // them means, and nothing else can be checked before it.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => {
                log::debug!("{library}: opened {c}");
                return Ok(Opened {
                    lib: ManuallyDrop::new(lib),
                    candidate: c.to_string(),
                });
            }
            Err(e) => {
                let msg = e.to_string();
                if msg.contains(NOT_FOUND) {
                    not_found.push(c);
                } else {
                    other.push(format!("{c}: {msg}"));
                }
            }
        }
    }
    let mut parts = Vec::new();
    if !not_found.is_empty() {
        parts.push(format!("not found ({NOT_FOUND}): {}", not_found.join(", ")));
    }
    parts.extend(other);
    Err(Unavailable::new(
        library,
        format!(
            "tried {} candidate(s); {}",
            candidates.len(),
            parts.join("; ")
        ),
    ))
}

/// The required symbols a library lacks, with the first `dlsym` message.
#[derive(Debug, Default)]
pub(crate) struct MissingSymbols {
    names: Vec<&'static str>,
    first_error: Option<libloading::Error>,
}

impl MissingSymbols {
    /// Record one missing symbol.
    pub(crate) fn push(&mut self, name: &'static str, error: libloading::Error) {
        self.names.push(name);
        if self.first_error.is_none() {
            self.first_error = Some(error);
        }
    }

    /// The [`Unavailable`] for `library` opened from `opened`.
    pub(crate) fn into_unavailable(self, library: &str, opened: &Opened) -> Unavailable {
        Unavailable::new(
            library,
            format!(
                "{} lacks required symbol(s) {} ({}); it is not {library} or is too old",
                opened.candidate,
                self.names.join(", "),
                self.first_error
                    .as_ref()
                    .map_or_else(|| "dlsym failed".to_string(), ToString::to_string),
            ),
        )
    }
}

/// Resolve `name` in `lib` as a value of type `T`.
///
/// # Safety
///
/// - `T` must be the function-pointer type of the C symbol `name` (same arguments, return type
///   and calling convention); calling through a mismatched type is undefined behaviour.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    name: &str,
) -> Result<T, libloading::Error> {
    // SAFETY: the caller guarantees that `T` matches the symbol's C type.
    unsafe { lib.get::<T>(name.as_bytes()) }.map(|sym| *sym)
}

/// The file name of the loaded object that contains `addr` (`dladdr`), if any.
pub(crate) fn file_of(addr: *const c_void) -> Option<String> {
    // SAFETY: `Dl_info` is a plain C struct of pointers, for which all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only looks `addr` up in the loader's tables and writes `info`, which is a
    // valid, exclusive out-pointer.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a NUL-terminated string owned by the loader; it stays valid while
    // the object is loaded, and the objects looked up here are never unloaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// Build a struct of typed function pointers from an [`Opened`] library.
///
/// ```text
/// fn_table! {
///     /// Doc.
///     pub(crate) struct Api {
///         cuInit: fn(c_uint) -> u32;
///     }
///     optional {
///         cuDeviceGetUuid_v2: fn(*mut Uuid, c_int) -> u32;
///     }
/// }
/// ```
///
/// generates `Api { cuInit: unsafe extern "C" fn(..) -> .., cuDeviceGetUuid_v2: Option<..> }`
/// and `unsafe fn Api::resolve(&Opened) -> Result<Api, MissingSymbols>`.
macro_rules! fn_table {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $req:ident : fn( $($arg:ty),* $(,)? ) -> $ret:ty ; )*
        }
        optional {
            $( $opt:ident : fn( $($oarg:ty),* $(,)? ) -> $oret:ty ; )*
        }
    ) => {
        $(#[$meta])*
        // Fields are C symbol names; a table may list symbols that are only checked.
        #[allow(non_snake_case, dead_code)]
        $vis struct $name {
            $(
                #[doc = concat!("`", stringify!($req), "`")]
                pub(crate) $req: unsafe extern "C" fn($($arg),*) -> $ret,
            )*
            $(
                #[doc = concat!("`", stringify!($opt), "`, when the library has it")]
                pub(crate) $opt: Option<unsafe extern "C" fn($($oarg),*) -> $oret>,
            )*
        }

        impl $name {
            /// Resolve every symbol of the table in `opened`.
            ///
            /// # Safety
            ///
            /// - `opened` must be the vendor library whose C prototypes the field types copy;
            ///   a same-named symbol with another prototype makes calls undefined behaviour.
            #[allow(non_snake_case)]
            pub(crate) unsafe fn resolve(
                opened: &$crate::loader::Opened,
            ) -> ::std::result::Result<Self, $crate::loader::MissingSymbols> {
                let mut missing = $crate::loader::MissingSymbols::default();
                $(
                    // SAFETY: the field type copies the C prototype (caller's contract).
                    let $req = match unsafe {
                        $crate::loader::symbol::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            opened.lib(),
                            stringify!($req),
                        )
                    } {
                        Ok(f) => Some(f),
                        Err(e) => {
                            missing.push(stringify!($req), e);
                            None
                        }
                    };
                )*
                $(
                    // SAFETY: the field type copies the C prototype (caller's contract).
                    let $opt = unsafe {
                        $crate::loader::symbol::<unsafe extern "C" fn($($oarg),*) -> $oret>(
                            opened.lib(),
                            stringify!($opt),
                        )
                    }
                    .ok();
                )*
                match ( $($req,)* ) {
                    ( $(Some($req),)* ) => ::std::result::Result::Ok(Self { $($req,)* $($opt,)* }),
                    #[allow(unreachable_patterns)]
                    _ => ::std::result::Result::Err(missing),
                }
            }
        }
    };
}
pub(crate) use fn_table;

/// Checks the loaders' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::Unavailable;

    /// A failed load names `soname` and every one of `candidates`, unless it opened one and the
    /// library's init call failed (its reason then contains `init_failed`).
    pub(crate) fn assert_names_every_candidate(
        e: &Unavailable,
        soname: &str,
        candidates: &[String],
        init_failed: Option<&str>,
    ) {
        assert_eq!(e.library, soname);
        if init_failed.is_some_and(|call| e.reason.contains(call)) {
            return;
        }
        for c in candidates {
            assert!(e.reason.contains(c), "{c} not in: {}", e.reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_keep_order_and_drop_duplicates() {
        let c = candidates(
            &["libx.so.1", "libx.so"],
            "libx.so.1",
            &["/a".to_string(), "/b".to_string(), "/a".to_string()],
        );
        assert_eq!(c, ["libx.so.1", "libx.so", "/a/libx.so.1", "/b/libx.so.1"]);
    }

    #[test]
    fn open_first_names_every_candidate_it_tried() {
        let tried = ["/nonexistent/gdx-a.so", "gdx-no-such-lib.so.7"];
        let err = match open_first("libx.so.1", &tried) {
            Ok(_) => panic!("opened a library that does not exist"),
            Err(e) => e,
        };
        assert_eq!(err.library, "libx.so.1");
        for t in tried {
            assert!(err.reason.contains(t), "{t} missing from: {}", err.reason);
        }
        assert!(
            err.reason.contains("tried 2 candidate(s)"),
            "{}",
            err.reason
        );
        assert!(err.reason.contains(NOT_FOUND), "{}", err.reason);
    }

    #[test]
    fn open_first_reports_other_loader_errors_in_full() {
        // A file that exists but is not a shared object: the loader's message is kept.
        let dir = std::env::temp_dir().join(format!("gdx-sys-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bogus = dir.join("libbogus.so.1");
        std::fs::write(&bogus, b"not an ELF file").unwrap();
        let bogus = bogus.to_string_lossy().into_owned();
        let err = match open_first("libbogus.so.1", &[bogus.as_str()]) {
            Ok(_) => panic!("opened a text file as a library"),
            Err(e) => e,
        };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.reason.contains(&format!("{bogus}: ")), "{}", err.reason);
        assert!(!err.reason.contains("not found ("), "{}", err.reason);
    }

    #[test]
    fn empty_candidate_list_is_unavailable() {
        let err = match open_first::<&str>("libx.so.1", &[]) {
            Ok(_) => panic!("opened nothing"),
            Err(e) => e,
        };
        assert!(err.reason.contains("no candidate"), "{}", err.reason);
    }

    /// The probes of cuFile and NCCL: each works or names every candidate it tried, answers
    /// the same twice (cached), and finds no such library at a path that does not exist, nor in
    /// libc (naming a symbol it lacks).
    #[test]
    fn probes_work_or_name_every_candidate() {
        use crate::{cufile, nccl};
        let cufile_ok = |p: &str| {
            assert!(!p.is_empty());
            assert!(cufile::is_available());
        };
        let nccl_ok = |p: &str| {
            assert!(!p.is_empty());
            let v = nccl::probe().unwrap().version.unwrap();
            assert!(v.parts().0 >= 2, "{v}");
        };
        type Probe = fn(&[&str]) -> Result<String, Unavailable>;
        type Lib<'a> = (&'a str, Vec<String>, Probe, &'a str, &'a dyn Fn(&str));
        let libs: [Lib<'_>; 2] = [
            (
                cufile::SONAME,
                cufile::default_candidates(),
                |c| cufile::probe_from(c).map(|i| i.path),
                "cuFileDriverOpen",
                &cufile_ok,
            ),
            (
                nccl::SONAME,
                nccl::default_candidates(),
                |c| nccl::probe_from(c).map(|i| i.path),
                "ncclGetVersion",
                &nccl_ok,
            ),
        ];
        assert_eq!(cufile::probe(), cufile::probe());
        assert_eq!(nccl::probe(), nccl::probe());
        for (soname, candidates, probe_from, symbol, ok) in libs {
            let mine: Vec<&str> = candidates.iter().map(String::as_str).collect();
            match probe_from(&mine) {
                Ok(path) => ok(&path),
                Err(e) => testing::assert_names_every_candidate(&e, soname, &candidates, None),
            }
            let bogus = format!("/nonexistent/gdx/{soname}");
            let e = probe_from(&[bogus.as_str()]).unwrap_err();
            assert!(e.reason.contains(&bogus), "{}", e.reason);
            let e = probe_from(&["libc.so.6"]).unwrap_err();
            assert!(e.reason.contains(symbol), "{}", e.reason);
        }
    }

    #[test]
    fn file_of_finds_libc_for_a_libc_symbol() {
        let path = file_of(libc::getpid as *const c_void).unwrap();
        assert!(path.contains("libc"), "{path}");
    }
}
