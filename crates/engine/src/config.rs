//! Agent configuration: a plain struct, optionally overridden by `GDX_*` environment variables.
//!
//! | variable | field | example |
//! |---|---|---|
//! | `GDX_AGENT_NAME` | [`AgentConfig::name`] | `trainer-3` |
//! | `GDX_LISTEN` | [`AgentConfig::listen`] | `0.0.0.0:7447`, `none` |
//! | `GDX_TRANSPORTS` | [`AgentConfig::transports`] | `tcp,shm,rdma` (default), `tcp`, `tcp,fabric` |
//! | `GDX_FABRIC_PROVIDER` | libfabric provider for `fabric` | `tcp`, `efa`, `auto` (default) |
//! | `GDX_TCP_STREAMS` | [`AgentConfig::tcp_streams`] | `2` |
//! | `GDX_NICS` | [`AgentConfig::nics`] | `10.0.0.1,10.0.1.1=10.0.1.2` (tcp), `rxe0,rxe1` (rdma) |
//! | `GDX_CHUNK_BYTES` | [`AgentConfig::chunk_bytes`] | `8388608` |
//! | `GDX_IO_TIMEOUT_MS` | [`AgentConfig::io_timeout`] | `10000` |
//! | `GDX_TIMEOUT_MS` | [`AgentConfig::transfer_timeout`] | `60000` |
//! | `GDX_HOST_ID` | [`AgentConfig::host_id`] | 32 hex digits |
//! | `GDX_SECRET_FILE` | [`AgentConfig::secret`] | `/etc/gdx/secret` (mode 600) |
//! | `GDX_INSECURE` | [`AgentConfig::insecure`] | `1` (no authentication; trusted networks only) |
//! | `GDX_HANDSHAKE_TIMEOUT_MS` | [`Limits::handshake_timeout`] | `5000` |
//! | `GDX_IDLE_TIMEOUT_MS` | [`Limits::idle_timeout`] | `600000` |
//! | `GDX_MAX_CONNECTIONS` | [`Limits::max_connections`] | `256` |
//! | `GDX_MAX_CONNECTIONS_PER_ADDR` | [`Limits::max_connections_per_addr`] | `128` |
//! | `GDX_FIRST_FRAME_TIMEOUT_MS` | [`Limits::first_frame_timeout`] | `1000` |
//! | `GDX_MAX_PENDING` | [`Limits::max_pending`] | `32` |
//! | `GDX_MAX_PENDING_PER_ADDR` | [`Limits::max_pending_per_addr`] | `8` |
//! | `GDX_MAX_PENDING_PER_NET` | [`Limits::max_pending_per_net`] | `16` |
//! | `GDX_SHM_ALLOW_UIDS` | [`AgentConfig::shm_allowed_uids`] | `1000,1001` |
//!
//! `GDX_LISTEN` takes the forms of [`parse_listen`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub use crate::auth::Secret;
pub use crate::limits::Limits;

use crate::error::{Error, Result};
use crate::wire::MAX_PAYLOAD;

/// Parses a listen address: `PORT` (loopback, `127.0.0.1:PORT`), `:PORT` (every IPv4
/// interface, `0.0.0.0:PORT`), `HOST:PORT` (an IP or a name that resolves), `[v6]:PORT`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the forms accepted.
pub fn parse_listen(s: &str) -> Result<SocketAddr> {
    let t = s.trim();
    let bad = || {
        Error::InvalidArgument(format!(
            "listen address {s:?}: expected PORT, :PORT, HOST:PORT or [IPv6]:PORT"
        ))
    };
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = t.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Some(p) = t.strip_prefix(':') {
        let port: u16 = p.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    // HOST:PORT with a name: the port must be numeric and the name must resolve.
    let (host, port) = t.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains(':') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    t.to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("listen address {s:?}: {e}")))?
        .next()
        .ok_or_else(bad)
}

/// Splits a `--nics` / `GDX_NICS` list (`A,B`, spaces allowed) into its entries.
pub fn parse_nics(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect()
}

/// A tcp rail from a [`AgentConfig::nics`] entry, for a peer at `peer`: the local address to
/// connect from and the peer's address to connect to. `None` for an entry that names no
/// address (an RDMA device such as `rxe0`).
pub(crate) fn tcp_rail(entry: &str, peer: SocketAddr) -> Option<(std::net::IpAddr, SocketAddr)> {
    let (local, remote) = match entry.split_once('=') {
        Some((l, r)) => (l.trim(), Some(r.trim())),
        None => (entry.trim(), None),
    };
    let local: std::net::IpAddr = local.parse().ok()?;
    let to = match remote {
        None => peer,
        Some(r) => match r.parse::<SocketAddr>() {
            Ok(a) => a,
            Err(_) => SocketAddr::new(r.parse().ok()?, peer.port()),
        },
    };
    Some((local, to))
}

#[cfg(test)]
#[test]
fn tcp_rails_parse_from_nics_entries() {
    let peer: SocketAddr = "10.0.0.2:7447".parse().unwrap();
    assert_eq!(
        tcp_rail("10.0.0.1", peer),
        Some(("10.0.0.1".parse().unwrap(), peer))
    );
    assert_eq!(
        tcp_rail("10.0.1.1=10.0.1.2", peer),
        Some((
            "10.0.1.1".parse().unwrap(),
            "10.0.1.2:7447".parse().unwrap()
        ))
    );
    assert_eq!(
        tcp_rail("127.0.0.2=127.0.0.3:9000", peer),
        Some((
            "127.0.0.2".parse().unwrap(),
            "127.0.0.3:9000".parse().unwrap()
        ))
    );
    assert_eq!(tcp_rail("rxe0", peer), None);
    assert_eq!(parse_nics(" rxe0, rxe1 ,"), vec!["rxe0", "rxe1"]);
}

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
    /// libfabric RMA (offered only when a provider opens; see
    /// [`crate::Agent::fabric_status`]). Off unless `GDX_TRANSPORTS` names it.
    pub fabric: bool,
}

impl Transports {
    pub(crate) fn bits(self) -> u32 {
        u32::from(self.tcp)
            | (u32::from(self.shm) << 1)
            | (u32::from(self.rdma) << 2)
            | (u32::from(self.fabric) << 3)
    }

    pub(crate) fn from_bits(b: u32) -> Transports {
        Transports {
            tcp: b & 1 != 0,
            shm: b & 2 != 0,
            rdma: b & 4 != 0,
            fabric: b & 8 != 0,
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
    /// Parallel TCP data streams per peer (per rail, with several [`AgentConfig::nics`]).
    pub tcp_streams: usize,
    /// The rails a peer connection stripes over and fails over between, in order. tcp: local
    /// addresses, each `LOCAL_IP` (to the peer's address) or `LOCAL_IP=REMOTE_IP[:PORT]` (to
    /// the peer's address on that NIC's network; the port defaults to the peer's); empty: one
    /// rail, wherever the kernel routes. rdma: device names; empty: every device with an
    /// ACTIVE port. At most [`crate::MAX_RAILS`].
    pub nics: Vec<String>,
    /// Largest piece a tcp op is cut into (≤ 64 MiB).
    pub chunk_bytes: u32,
    /// How long a started socket read or write may stall before the peer is declared lost.
    pub io_timeout: Duration,
    /// Default deadline of a transfer (also used for local waits on region leases).
    pub transfer_timeout: Duration,
    /// Host identity override; by default the kernel boot id (same value: shared memory can work).
    pub host_id: Option<u128>,
    /// The secret peers must prove they hold (both ways) before anything is shared. `None`: a
    /// random secret generated when the agent starts ([`crate::Agent::secret`]), shared by every
    /// agent of this process that also has `None` — so agents of one process reach each other,
    /// and nobody else does until given the secret.
    pub secret: Option<Secret>,
    /// No authentication at all (the version-2 behaviour): any client that connects gets every
    /// published descriptor and key. Only for trusted, isolated networks; both sides must agree
    /// (an authenticating agent refuses an insecure peer and vice versa).
    pub insecure: bool,
    /// Bounds on what peers may hold (connections, deadlines, queues, leases).
    pub limits: Limits,
    /// User ids allowed on the shm socket besides this process's own (`SO_PEERCRED`).
    pub shm_allowed_uids: Vec<u32>,
    /// Whether this agent lets its shm peers copy straight into and out of its borrowed host
    /// regions (`cma`: `process_vm_writev`/`readv` by the peer, allowed under Yama's
    /// `ptrace_scope` 1 with `prctl(PR_SET_PTRACER, peer)`); off, their ops stage through the
    /// bounce buffer and say so (`GDX_SHM_CMA=0`).
    pub shm_cma: bool,
    /// The libfabric provider of the `fabric` transport (`tcp`, `shm`, `efa`); `None`:
    /// `GDX_FABRIC_PROVIDER`, else automatic (efa > verbs > cxi > tcp).
    pub fabric_provider: Option<String>,
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
                fabric: false,
            },
            tcp_streams: 2,
            nics: Vec::new(),
            chunk_bytes: 8 << 20,
            io_timeout: Duration::from_secs(10),
            transfer_timeout: Duration::from_secs(60),
            host_id: None,
            secret: None,
            insecure: false,
            limits: Limits::default(),
            shm_allowed_uids: Vec::new(),
            shm_cma: true,
            fabric_provider: None,
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
                Some(parse_listen(&v).map_err(|e| {
                    Error::InvalidArgument(format!("GDX_LISTEN: {}", e.wire_message()))
                })?)
            };
        }
        if let Some(v) = var("GDX_TRANSPORTS") {
            let mut t = Transports {
                tcp: false,
                shm: false,
                rdma: false,
                fabric: false,
            };
            for part in v.split(',').map(str::trim) {
                match part {
                    "tcp" => t.tcp = true,
                    "shm" => t.shm = true,
                    "rdma" => t.rdma = true,
                    "fabric" => t.fabric = true,
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
        if let Some(v) = var("GDX_NICS") {
            self.nics = parse_nics(&v);
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
        if let Some(v) = var("GDX_SECRET_FILE") {
            self.secret = Some(Secret::from_file(std::path::Path::new(&v))?);
        }
        if let Some(v) = var("GDX_INSECURE") {
            self.insecure = matches!(v.trim(), "1" | "true" | "yes");
        }
        if let Some(v) = var("GDX_HANDSHAKE_TIMEOUT_MS") {
            self.limits.handshake_timeout =
                Duration::from_millis(parse("GDX_HANDSHAKE_TIMEOUT_MS", &v)?);
        }
        if let Some(v) = var("GDX_IDLE_TIMEOUT_MS") {
            self.limits.idle_timeout = Duration::from_millis(parse("GDX_IDLE_TIMEOUT_MS", &v)?);
        }
        if let Some(v) = var("GDX_MAX_CONNECTIONS") {
            self.limits.max_connections = parse("GDX_MAX_CONNECTIONS", &v)?;
        }
        if let Some(v) = var("GDX_MAX_CONNECTIONS_PER_ADDR") {
            self.limits.max_connections_per_addr = parse("GDX_MAX_CONNECTIONS_PER_ADDR", &v)?;
        }
        if let Some(v) = var("GDX_FIRST_FRAME_TIMEOUT_MS") {
            self.limits.first_frame_timeout =
                Duration::from_millis(parse("GDX_FIRST_FRAME_TIMEOUT_MS", &v)?);
        }
        if let Some(v) = var("GDX_MAX_PENDING") {
            self.limits.max_pending = parse("GDX_MAX_PENDING", &v)?;
        }
        if let Some(v) = var("GDX_MAX_PENDING_PER_ADDR") {
            self.limits.max_pending_per_addr = parse("GDX_MAX_PENDING_PER_ADDR", &v)?;
        }
        if let Some(v) = var("GDX_MAX_PENDING_PER_NET") {
            self.limits.max_pending_per_net = parse("GDX_MAX_PENDING_PER_NET", &v)?;
        }
        if let Some(v) = var("GDX_SHM_ALLOW_UIDS") {
            self.shm_allowed_uids = v
                .split(',')
                .map(|u| parse("GDX_SHM_ALLOW_UIDS", u))
                .collect::<Result<_>>()?;
        }
        if let Some(v) = var("GDX_SHM_CMA") {
            self.shm_cma = match v.trim() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "GDX_SHM_CMA={v:?} is not valid: use 1 (peers copy directly into this \
                         agent's borrowed regions) or 0 (they stage through a bounce buffer)"
                    )))
                }
            };
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
        if self.nics.len() > crate::MAX_RAILS {
            return Err(Error::InvalidArgument(format!(
                "nics: {} given, at most {} rails",
                self.nics.len(),
                crate::MAX_RAILS
            )));
        }
        if let Some(n) = self.nics.iter().find(|n| n.trim().is_empty()) {
            return Err(Error::InvalidArgument(format!("nics: empty entry {n:?}")));
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
        if self.insecure && self.secret.is_some() {
            return Err(Error::InvalidArgument(
                "a secret and insecure mode exclude each other".into(),
            ));
        }
        self.limits.validate()
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
