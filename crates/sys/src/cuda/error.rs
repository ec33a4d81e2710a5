//! [`CudaError`]: a failed driver call, with the call, the `CUresult` name and the GPU.

/// A CUDA driver call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A driver call returned an error status.
    #[error("{call}{} failed: {name} ({code}): {description}", on_gpu(.device))]
    Call {
        /// The call, e.g. `cuDeviceGetName` or
        /// `cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)`.
        call: String,
        /// The `CUresult` number.
        code: u32,
        /// The `CUresult` name from `cuGetErrorName`, e.g. `CUDA_ERROR_INVALID_DEVICE`.
        name: String,
        /// The text from `cuGetErrorString`.
        description: String,
        /// The GPU ordinal the call was about, if any.
        device: Option<u32>,
    },
    /// The driver or the GPU does not support the call (`CUDA_ERROR_NOT_SUPPORTED`).
    #[error("{call}{} is not supported by this driver or GPU (CUDA_ERROR_NOT_SUPPORTED)", on_gpu(.device))]
    Unsupported {
        /// The call.
        call: String,
        /// The GPU ordinal the call was about, if any.
        device: Option<u32>,
    },
    /// A GPU ordinal at or past the number of devices.
    #[error("no GPU {ordinal}: the CUDA driver reports {count} device(s)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// How many devices the driver reports.
        count: u32,
    },
    /// A byte range outside a buffer; found before any driver call.
    #[error("{len} byte(s) at offset {offset} do not fit in the {size}-byte {what}")]
    OutOfBounds {
        /// Which buffer, e.g. `destination device buffer`.
        what: &'static str,
        /// First byte of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the buffer.
        size: usize,
    },
    /// A whole-buffer copy between buffers of different sizes; found before any driver call.
    #[error("cannot copy a {src}-byte buffer into a {dst}-byte buffer: sizes differ")]
    LengthMismatch {
        /// Destination size in bytes.
        dst: usize,
        /// Source size in bytes.
        src: usize,
    },
    /// An argument the call cannot take, found before calling the driver.
    #[error("{call}: {reason}")]
    InvalidArgument {
        /// The call that was not made.
        call: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The loaded driver lacks an optional entry point (it is older than the call).
    #[error("{call} is not exported by the loaded libcuda (driver too old)")]
    MissingSymbol {
        /// The symbol.
        call: &'static str,
    },
    /// The mailbox service kernel cannot serve an op (it exited, or an op was not served in
    /// time); see `mailbox`.
    #[error("mailbox: {what}")]
    Mailbox {
        /// The GPU (CUDA ordinal) whose mailbox it is.
        gpu: u32,
        /// What happened.
        what: String,
    },
    /// An operating-system call made for a CUDA object failed (e.g. `mmap` of a file range
    /// to register).
    #[error("{call} failed: {reason}")]
    Os {
        /// The system call.
        call: &'static str,
        /// The OS error, and what was asked.
        reason: String,
    },
    /// A release in a destructor (`cuMemFree_v2`, `cuStreamDestroy_v2`, ...) failed earlier on
    /// this context; reported once, by the next call that checks.
    #[error("an earlier release failed: {0}")]
    Earlier(Box<CudaError>),
}

impl CudaError {
    /// The `CUresult` number, when the error came from a driver status.
    pub fn code(&self) -> Option<u32> {
        match self {
            CudaError::Call { code, .. } => Some(*code),
            CudaError::Unsupported { .. } => Some(super::api::NOT_SUPPORTED),
            CudaError::Earlier(e) => e.code(),
            _ => None,
        }
    }
}

fn on_gpu(device: &Option<u32>) -> String {
    match device {
        Some(d) => format!(" on GPU {d}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_call_status_and_gpu() {
        let e = CudaError::Call {
            call: "cuDeviceGetName".into(),
            code: 101,
            name: "CUDA_ERROR_INVALID_DEVICE".into(),
            description: "invalid device ordinal".into(),
            device: Some(3),
        };
        assert_eq!(
            e.to_string(),
            "cuDeviceGetName on GPU 3 failed: CUDA_ERROR_INVALID_DEVICE (101): invalid device ordinal"
        );
        assert_eq!(e.code(), Some(101));
        let e = CudaError::Unsupported {
            call: "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)".into(),
            device: None,
        };
        assert_eq!(
            e.to_string(),
            "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) is not supported by this \
             driver or GPU (CUDA_ERROR_NOT_SUPPORTED)"
        );
        assert_eq!(e.code(), Some(801));
        let e = CudaError::NoSuchDevice {
            ordinal: 2,
            count: 1,
        };
        assert_eq!(
            e.to_string(),
            "no GPU 2: the CUDA driver reports 1 device(s)"
        );
        assert_eq!(e.code(), None);
        let e = CudaError::OutOfBounds {
            what: "source device buffer",
            offset: 10,
            len: 8,
            size: 16,
        };
        assert_eq!(
            e.to_string(),
            "8 byte(s) at offset 10 do not fit in the 16-byte source device buffer"
        );
        let e = CudaError::Earlier(Box::new(CudaError::Unsupported {
            call: "cuMemFree_v2".into(),
            device: Some(0),
        }));
        assert!(e
            .to_string()
            .starts_with("an earlier release failed: cuMemFree_v2 on GPU 0"));
        assert_eq!(e.code(), Some(801));
    }
}
