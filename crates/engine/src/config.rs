//! Agent configuration: a plain struct, optionally overridden by `GDX_*` environment variables.
//!
//! | variable | field | example |
//! |---|---|---|
//! | `GDX_AGENT_NAME` | [`AgentConfig::name`] | `trainer-3` |
//! | `GDX_LISTEN` | [`AgentConfig::listen`] | `0.0.0.0:7447`, `none` |
//! | `GDX_TRANSPORTS` | [`AgentConfig::transports`] | `tcp,shm,rdma` (default), `tcp` |
//! | `GDX_TCP_STREAMS` | [`AgentConfig::tcp_streams`] | `2` |
//! | `GDX_CHUNK_BYTES` | [`AgentConfig::chunk_bytes`] | `8388608` |
//! | `GDX_IO_TIMEOUT_MS` | [`AgentConfig::io_timeout`] | `10000` |
//! | `GDX_TIMEOUT_MS` | [`AgentConfig::transfer_timeout`] | `60000` |
//! | `GDX_HOST_ID` | [`AgentConfig::host_id`] | 32 hex digits |

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wire::MAX_PAYLOAD;

/// Which transports an agent offers and uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transports {
    /// Kernel TCP sockets (always needed for the control connection).
    pub tcp: bool,
    /// Shared memory between processes of one host.
    pub shm: bool,
    /// RDMA verbs between hosts (offered only when this host has an RDMA device; see
    /// [`crate::Agent::rdma_status`]).
    pub rdma: bool,
}

impl Transports {
    pub(crate) fn bits(self) -> u32 {
        u32::from(self.tcp) | (u32::from(self.shm) << 1) | (u32::from(self.rdma) << 2)
    }

    pub(crate) fn from_bits(b: u32) -> Transports {
        Transports {
            tcp: b & 1 != 0,
            shm: b & 2 != 0,
            rdma: b & 4 != 0,
        }
    }
}

/// How an [`crate::Agent`] is set up. `Default` gives a named-by-pid agent listening on an ephemeral
/// loopback port with tcp and shm enabled.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Agent name, shown to peers.
    pub name: String,
    /// Address to accept peers on; `None` for an agent that only connects out.
    pub listen: Option<SocketAddr>,
    /// Transports enabled.
    pub transports: Transports,
    /// Parallel TCP data streams per peer.
    pub tcp_streams: usize,
    /// Largest piece a tcp op is cut into (≤ 64 MiB).
    pub chunk_bytes: u32,
    /// How long a started socket read or write may stall before the peer is declared lost.
    pub io_timeout: Duration,
    /// Default deadline of a transfer (also used for local waits on region leases).
    pub transfer_timeout: Duration,
    /// Host identity override; by default the kernel boot id (same value: shared memory can work).
    pub host_id: Option<u128>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            name: format!("gdx-{}", std::process::id()),
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            transports: Transports {
                tcp: true,
                shm: true,
                rdma: true,
            },
            tcp_streams: 2,
            chunk_bytes: 8 << 20,
            io_timeout: Duration::from_secs(10),
            transfer_timeout: Duration::from_secs(60),
            host_id: None,
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
    v.trim()
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("{name}={v:?} is not valid")))
}

impl AgentConfig {
    /// The defaults with every `GDX_*` variable applied.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable that does not parse.
    pub fn from_env() -> Result<Self> {
        AgentConfig::default().with_env()
    }

    /// `self` with every set `GDX_*` variable applied on top.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable that does not parse.
    pub fn with_env(mut self) -> Result<Self> {
        if let Some(v) = var("GDX_AGENT_NAME") {
            self.name = v;
        }
        if let Some(v) = var("GDX_LISTEN") {
            self.listen = if v == "none" {
                None
            } else {
                Some(parse("GDX_LISTEN", &v)?)
            };
        }
        if let Some(v) = var("GDX_TRANSPORTS") {
            let mut t = Transports {
                tcp: false,
                shm: false,
                rdma: false,
            };
            for part in v.split(',').map(str::trim) {
                match part {
                    "tcp" => t.tcp = true,
                    "shm" => t.shm = true,
                    "rdma" => t.rdma = true,
                    other => {
                        return Err(Error::InvalidArgument(format!(
                            "GDX_TRANSPORTS: unknown transport {other:?}"
                        )))
                    }
                }
            }
            self.transports = t;
        }
        if let Some(v) = var("GDX_TCP_STREAMS") {
            self.tcp_streams = parse("GDX_TCP_STREAMS", &v)?;
        }
        if let Some(v) = var("GDX_CHUNK_BYTES") {
            self.chunk_bytes = parse("GDX_CHUNK_BYTES", &v)?;
        }
        if let Some(v) = var("GDX_IO_TIMEOUT_MS") {
            self.io_timeout = Duration::from_millis(parse("GDX_IO_TIMEOUT_MS", &v)?);
        }
        if let Some(v) = var("GDX_TIMEOUT_MS") {
            self.transfer_timeout = Duration::from_millis(parse("GDX_TIMEOUT_MS", &v)?);
        }
        if let Some(v) = var("GDX_HOST_ID") {
            self.host_id =
                Some(u128::from_str_radix(v.trim(), 16).map_err(|_| {
                    Error::InvalidArgument(format!("GDX_HOST_ID={v:?} is not hex"))
                })?);
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks the values are usable.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] describing the bad field.
    pub fn validate(&self) -> Result<()> {
        if !self.transports.tcp {
            return Err(Error::InvalidArgument(
                "the tcp transport is required (it carries the control connection)".into(),
            ));
        }
        if self.tcp_streams == 0 || self.tcp_streams > 64 {
            return Err(Error::InvalidArgument(format!(
                "tcp_streams {} not in 1..=64",
                self.tcp_streams
            )));
        }
        if self.chunk_bytes == 0 || self.chunk_bytes > MAX_PAYLOAD {
            return Err(Error::InvalidArgument(format!(
                "chunk_bytes {} not in 1..={MAX_PAYLOAD}",
                self.chunk_bytes
            )));
        }
        if self.io_timeout.is_zero() || self.transfer_timeout.is_zero() {
            return Err(Error::InvalidArgument("timeouts must be > 0".into()));
        }
        Ok(())
    }
}

/// The kernel boot id as a 128-bit number: processes that see the same value share a kernel, so
/// memfd passing can work between them.
pub(crate) fn boot_host_id() -> u128 {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .and_then(|s| u128::from_str_radix(&s.trim().replace('-', ""), 16).ok())
        .unwrap_or(0)
}
