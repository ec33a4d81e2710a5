//! [`VerbsError`]: a failed verbs call, with the call, the device and the errno by name.

use crate::Unavailable;
use std::fmt;

/// An errno value printed with its symbolic name and text, e.g. `Bad address (EFAULT)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The last OS error of this thread (what a verbs call returning NULL left in `errno`).
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The symbolic name for the errno values verbs calls return (`EFAULT`), else `None`.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::EINTR => "EINTR",
            libc::EIO => "EIO",
            libc::ENXIO => "ENXIO",
            libc::EBADF => "EBADF",
            libc::EAGAIN => "EAGAIN",
            libc::ENOMEM => "ENOMEM",
            libc::EACCES => "EACCES",
            libc::EFAULT => "EFAULT",
            libc::EBUSY => "EBUSY",
            libc::EEXIST => "EEXIST",
            libc::ENODEV => "ENODEV",
            libc::EINVAL => "EINVAL",
            libc::ENOSPC => "ENOSPC",
            libc::ERANGE => "ERANGE",
            libc::ENOSYS => "ENOSYS",
            libc::ENODATA => "ENODATA",
            libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
            libc::ENETUNREACH => "ENETUNREACH",
            libc::ETIMEDOUT => "ETIMEDOUT",
            libc::EHOSTUNREACH => "EHOSTUNREACH",
            libc::ECONNREFUSED => "ECONNREFUSED",
            _ => return None,
        })
    }

    /// Whether the value means "not supported here" (`EOPNOTSUPP`, `EPROTONOSUPPORT`,
    /// `ENOSYS`).
    pub fn is_unsupported(self) -> bool {
        matches!(
            self.0,
            libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS
        )
    }
}

impl fmt::Display for Errno {
    /// `Bad address (EFAULT)`; `errno 0` when a call failed without setting errno.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("failed without an errno (errno 0)");
        }
        let text = std::io::Error::from_raw_os_error(self.0).to_string();
        // std appends " (os error N)"; the symbolic name says more.
        let text = text.split(" (os error").next().unwrap_or(&text).to_string();
        match self.name() {
            Some(n) => write!(f, "{text} ({n})"),
            None => write!(f, "{text} (errno {})", self.0),
        }
    }
}

/// A verbs call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs could not be loaded or used.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// No RDMA device of that name.
    #[error("no RDMA device {name}; libibverbs lists {}", list_or_none(.available))]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices libibverbs lists.
        available: Vec<String>,
    },
    /// A verbs call returned an error.
    #[error("{call} on {device}{} failed: {errno}", subject(.what))]
    Call {
        /// The verbs call, e.g. `ibv_reg_mr`.
        call: &'static str,
        /// RDMA device name.
        device: String,
        /// What the call was about, e.g. `1048576 bytes at 0x7f3a00000000`; may be empty.
        what: String,
        /// The errno.
        errno: Errno,
    },
    /// The call is not supported by this libibverbs, provider or kernel (`EOPNOTSUPP`,
    /// `EPROTONOSUPPORT`, `ENOSYS`, or a symbol the loaded libibverbs lacks).
    #[error("{call} on {device} is not supported: {detail}")]
    Unsupported {
        /// The verbs call.
        call: &'static str,
        /// RDMA device name.
        device: String,
        /// Why (the errno, or the missing symbol).
        detail: String,
    },
    /// An argument the call cannot take, found before calling libibverbs.
    #[error("{call}: {reason}")]
    InvalidArgument {
        /// The call that was not made.
        call: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl VerbsError {
    /// The [`VerbsError`] for `call` on `device` that set `errno`: `Unsupported` for the
    /// not-supported codes, `Call` otherwise.
    pub fn from_errno(
        call: &'static str,
        device: &str,
        what: impl Into<String>,
        errno: Errno,
    ) -> VerbsError {
        if errno.is_unsupported() {
            let what = what.into();
            let detail = if what.is_empty() {
                errno.to_string()
            } else {
                format!("{what}: {errno}")
            };
            return VerbsError::Unsupported {
                call,
                device: device.to_string(),
                detail,
            };
        }
        VerbsError::Call {
            call,
            device: device.to_string(),
            what: what.into(),
            errno,
        }
    }

    /// The errno, when the error came from one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            VerbsError::Call { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn subject(what: &str) -> String {
    if what.is_empty() {
        String::new()
    } else {
        format!(" ({what})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_prints_text_and_name() {
        assert_eq!(Errno(libc::EFAULT).to_string(), "Bad address (EFAULT)");
        assert_eq!(Errno(libc::EBADF).name(), Some("EBADF"));
        assert!(Errno(9999).to_string().contains("errno 9999"));
        assert!(Errno(0).to_string().contains("errno 0"));
    }

    #[test]
    fn not_supported_codes_become_unsupported() {
        let e = VerbsError::from_errno("ibv_reg_dmabuf_mr", "mlx5_0", "", Errno(libc::EOPNOTSUPP));
        assert!(matches!(e, VerbsError::Unsupported { .. }), "{e:?}");
        let e = VerbsError::from_errno(
            "ibv_reg_mr",
            "mlx5_0",
            "4096 bytes at 0x1000",
            Errno(libc::EFAULT),
        );
        assert_eq!(
            e.to_string(),
            "ibv_reg_mr on mlx5_0 (4096 bytes at 0x1000) failed: Bad address (EFAULT)"
        );
        assert_eq!(e.errno(), Some(Errno(libc::EFAULT)));
    }

    #[test]
    fn no_such_device_lists_what_exists() {
        let e = VerbsError::NoSuchDevice {
            name: "mlx5_9".into(),
            available: vec![],
        };
        assert_eq!(
            e.to_string(),
            "no RDMA device mlx5_9; libibverbs lists none"
        );
    }
}
