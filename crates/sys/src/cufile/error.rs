//! [`CufileError`]: a failed cuFile call, with the call, the status name and the subject.

use super::api;
use crate::cuda::CudaError;
use crate::Unavailable;
use std::ffi::c_int;

/// A cuFile call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CufileError {
    /// The library could not be loaded.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A call returned a `CUfileOpError` status.
    #[error("{call} failed: {name} ({code}): {description}{}", cuda_suffix(.cuda))]
    Call {
        /// The call and its subject, e.g. `cuFileHandleRegister(/data/x.bin)`.
        call: String,
        /// The `CUfileOpError` number.
        code: i32,
        /// Its name, e.g. `CU_FILE_DIO_NOT_SET`.
        name: String,
        /// cufile.h's text for it.
        description: String,
        /// The `CUresult` when the status is `CU_FILE_CUDA_DRIVER_ERROR`.
        cuda: Option<i32>,
    },
    /// The platform, file or GPU does not support GPUDirect Storage (`CU_FILE_*_NOT_SUPPORTED`,
    /// `CU_FILE_IO_DISABLED`).
    #[error("{call}: not supported here: {name} ({code}): {description}")]
    Unsupported {
        /// The call and its subject.
        call: String,
        /// The `CUfileOpError` number.
        code: i32,
        /// Its name.
        name: String,
        /// cufile.h's text for it.
        description: String,
    },
    /// `cuFileRead`/`cuFileWrite` returned -1: a file system error, with `errno`.
    #[error("{call} failed: {source}")]
    Io {
        /// The call and its subject, e.g. `cuFileRead(/data/x.bin, 16777216 bytes at 0)`.
        call: String,
        /// The error from `errno`.
        #[source]
        source: std::io::Error,
    },
    /// A CUDA driver call the cuFile wrapper needed (making the buffer's context current).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// An argument refused before calling cuFile.
    #[error("{call}: {reason}")]
    InvalidArgument {
        /// The call that was not made.
        call: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl CufileError {
    /// The error for a `CUfileError_t` status of `call`; `Ok` for success.
    pub(crate) fn check(status: api::Status, call: impl FnOnce() -> String) -> Result<(), Self> {
        if status.err == api::SUCCESS {
            return Ok(());
        }
        Err(Self::from_code(status.err, status.cu_err, call()))
    }

    /// The error for `CUfileOpError` `code` (sign ignored) of `call`.
    pub(crate) fn from_code(code: c_int, cu_err: c_int, call: String) -> Self {
        let abs = code.checked_abs().unwrap_or(c_int::MAX);
        let (name, description) = match api::op_error(abs) {
            Some((n, d)) => (n.to_string(), d.to_string()),
            None => (
                format!("CUfileOpError {abs}"),
                "unknown cufile error".to_string(),
            ),
        };
        if api::UNSUPPORTED.contains(&abs) {
            return CufileError::Unsupported {
                call,
                code: abs,
                name,
                description,
            };
        }
        CufileError::Call {
            call,
            code: abs,
            name,
            description,
            cuda: (abs == api::CUDA_DRIVER_ERROR).then_some(cu_err),
        }
    }

    /// The error for a negative `ssize_t` from `cuFileRead`/`cuFileWrite`: -1 means `errno`,
    /// any other negative value is `-CUfileOpError`.
    pub(crate) fn from_io_return(ret: isize, errno: std::io::Error, call: String) -> Self {
        if ret == -1 {
            return CufileError::Io {
                call,
                source: errno,
            };
        }
        let code = c_int::try_from(ret).unwrap_or(c_int::MIN);
        Self::from_code(code, 0, call)
    }

    /// The `CUfileOpError` number, when the error came from a cuFile status.
    pub fn code(&self) -> Option<i32> {
        match self {
            CufileError::Call { code, .. } | CufileError::Unsupported { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn cuda_suffix(cuda: &Option<i32>) -> String {
    match cuda {
        Some(c) => format!(" (CUresult {c})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_display_call_name_and_text() {
        let e = CufileError::from_code(5020, 0, "cuFileHandleRegister(/x)".into());
        assert_eq!(
            e.to_string(),
            "cuFileHandleRegister(/x) failed: CU_FILE_DIO_NOT_SET (5020): fd direct IO not set"
        );
        assert_eq!(e.code(), Some(5020));
        let e = CufileError::from_code(5011, 700, "cuFileBufRegister".into());
        assert!(e.to_string().ends_with("(CUresult 700)"), "{e}");
        let e = CufileError::from_code(-5008, 0, "cuFileRead".into());
        assert!(
            matches!(e, CufileError::Unsupported { code: 5008, .. }),
            "{e:?}"
        );
        let e = CufileError::from_code(5999, 0, "cuFileRead".into());
        assert!(e.to_string().contains("CUfileOpError 5999"), "{e}");
    }

    #[test]
    fn io_returns_are_errno_or_negated_statuses() {
        let e = CufileError::from_io_return(
            -1,
            std::io::Error::from_raw_os_error(5),
            "cuFileRead(/x, 4096 bytes at 0)".into(),
        );
        assert!(matches!(e, CufileError::Io { .. }));
        assert!(
            e.to_string()
                .starts_with("cuFileRead(/x, 4096 bytes at 0) failed: "),
            "{e}"
        );
        let e = CufileError::from_io_return(
            -5024,
            std::io::Error::from_raw_os_error(0),
            "cuFileRead".into(),
        );
        assert_eq!(e.code(), Some(5024));
    }

    #[test]
    fn success_is_ok() {
        assert!(CufileError::check(api::Status::default(), || unreachable!()).is_ok());
    }
}
