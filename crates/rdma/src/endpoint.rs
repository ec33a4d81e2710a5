//! [`RdmaEndpoint`]: one RDMA device port ready for connections: the opened device and
//! protection domain, the chosen port and GID, and the registration cache.
//!
//! ```text
//! RdmaEndpoint::open("mlx5_0", EndpointConfig::default())      // port, GID (GDX_IB_GID_INDEX)
//!   .register(&Memory::gpu(buf))        -> MrHandle (cached; says dma-buf / peermem / staged)
//!   .completion_queue(entries)          -> CompletionQueue
//!   .prepare(&cq, qps)                  -> PreparedQp (QPs in INIT) -> conn_data() to the peer
//! PreparedQp::connect(&peer_conn_data)  -> Qp (QPs in RTS): post_write / post_read
//! ```

use crate::cache::{CacheStats, MemRange, RegCache};
use crate::cq::{CompletionQueue, MrHandle};
use crate::discovery;
use crate::error::RdmaError;
use crate::gid::{self, GidChoice, LinkKind, NetdevView, SysfsNetdevs};
use crate::nic::{choose_nics, MemPlace, NicChoice};
use crate::qp::PreparedQp;
use crate::register::{Memory, RegPolicy, VerbsRegistrar};
use gdx_sys::verbs::{Access, DeviceCaps, Port, PortState, RdmaContext, VerbsError};
use gdx_topo::Topology;
use std::fmt;
use std::sync::Arc;

/// Settings of an endpoint and of the connections it makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Port number; 0 picks the first active port.
    pub port: u8,
    /// GID index; `None` reads `GDX_IB_GID_INDEX`, then chooses automatically.
    pub gid_index: Option<u32>,
    /// Refuse GPU memory that only a staged path could serve.
    pub strict: bool,
    /// Try dma-buf for GPU memory.
    pub dmabuf: bool,
    /// Try peermem for GPU memory.
    pub peermem: bool,
    /// Register with relaxed PCIe ordering.
    pub relaxed_ordering: bool,
    /// Bytes of unused registrations the cache keeps.
    pub cache_budget_bytes: u64,
    /// Queue pairs per connection ([`RdmaEndpoint::prepare`] may ask for another number).
    pub qps_per_peer: u16,
    /// Send-queue depth per queue pair.
    pub max_send_wr: u32,
    /// Largest work request; larger items are split and spread over the queue pairs.
    pub chunk_bytes: u64,
    /// Bytes one [`crate::Qp::run`] keeps in flight at most (at least one request always
    /// goes). Far above any NIC's bandwidth-delay product, and small enough that a slow
    /// device (Soft-RoCE) retires what is posted well inside a wait.
    pub max_inflight_bytes: u64,
    /// Local ACK timeout code (4.096 µs × 2^n): 17 ≈ 0.5 s per try.
    pub ack_timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RoCE traffic class (DSCP << 2).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Cap on the path MTU in bytes.
    pub max_mtu: Option<u32>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            port: 0,
            gid_index: None,
            strict: false,
            dmabuf: true,
            peermem: true,
            relaxed_ordering: false,
            cache_budget_bytes: 8 << 30,
            qps_per_peer: 2,
            max_send_wr: 256,
            chunk_bytes: 4 << 20,
            max_inflight_bytes: 64 << 20,
            ack_timeout: 17,
            retry_cnt: 7,
            rnr_retry: 7,
            traffic_class: 0,
            service_level: 0,
            max_mtu: None,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) ctx: RdmaContext,
    pub(crate) port: Port,
    pub(crate) link: LinkKind,
    pub(crate) gid: GidChoice,
    pub(crate) config: EndpointConfig,
    pub(crate) cache: RegCache<VerbsRegistrar>,
}

/// One RDMA device port, ready to register memory and make connections. Cheap to clone.
#[derive(Clone)]
pub struct RdmaEndpoint {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RdmaEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaEndpoint")
            .field("device", &self.device())
            .field("port", &self.inner.port.number)
            .field("link", &self.inner.link)
            .field("gid", &self.inner.gid)
            .finish()
    }
}

/// The port to use: `wanted`, or the first active one when 0.
fn pick_port(ctx: &RdmaContext, wanted: u8) -> Result<Port, RdmaError> {
    let count = ctx.caps().phys_port_cnt;
    if wanted != 0 {
        if wanted > count {
            return Err(RdmaError::InvalidArgument(format!(
                "{} has {count} port(s); port {wanted} does not exist",
                ctx.name()
            )));
        }
        let p = ctx.port(wanted);
        if let Some(e) = &p.error {
            return Err(RdmaError::InvalidArgument(e.clone()));
        }
        if p.state != PortState::Active {
            return Err(RdmaError::InvalidArgument(format!(
                "{} port {wanted} is {}, not PORT_ACTIVE",
                ctx.name(),
                p.state
            )));
        }
        return Ok(p);
    }
    let ports: Vec<Port> = (1..=count).map(|n| ctx.port(n)).collect();
    let states: Vec<String> = ports
        .iter()
        .map(|p| format!("port {} {}", p.number, p.state))
        .collect();
    ports
        .into_iter()
        .find(|p| p.error.is_none() && p.state == PortState::Active)
        .ok_or_else(|| {
            RdmaError::InvalidArgument(format!(
                "{} has no active port ({})",
                ctx.name(),
                states.join(", ")
            ))
        })
}

impl RdmaEndpoint {
    /// Open `device` on the running machine: port, GID (libibverbs' table, netdev state and
    /// addresses of this machine), registration cache.
    pub fn open(device: &str, config: EndpointConfig) -> Result<RdmaEndpoint, RdmaError> {
        Self::open_with(device, config, &SysfsNetdevs::live())
    }

    /// [`RdmaEndpoint::open`] with netdev facts from `netdevs`.
    pub fn open_with(
        device: &str,
        config: EndpointConfig,
        netdevs: &dyn NetdevView,
    ) -> Result<RdmaEndpoint, RdmaError> {
        let ctx = match RdmaContext::open(device) {
            Ok(c) => c,
            Err(VerbsError::Unavailable(u)) => {
                return Err(discovery::classify(Err(u), std::path::Path::new("/"))
                    .err()
                    .map_or_else(
                        || RdmaError::InvalidArgument(device.into()),
                        RdmaError::from,
                    ))
            }
            Err(VerbsError::NoSuchDevice { available, .. }) if available.is_empty() => {
                return Err(discovery::classify(Ok(vec![]), std::path::Path::new("/"))
                    .err()
                    .map_or_else(
                        || RdmaError::InvalidArgument(device.into()),
                        RdmaError::from,
                    ))
            }
            Err(e) => return Err(e.into()),
        };
        let port = pick_port(&ctx, config.port)?;
        let link = LinkKind::from_text(Some(&port.link_layer.to_string()));
        let override_index = match config.gid_index {
            Some(i) => Some(i),
            None => gid::override_from_env()?,
        };
        let gid = gid::select_gid(
            device,
            u32::from(port.number),
            link,
            &gid::candidates_from_verbs(&port),
            netdevs,
            override_index,
        )?;
        if u8::try_from(gid.index).is_err() {
            return Err(RdmaError::InvalidArgument(format!(
                "GID index {} does not fit a queue pair's 8-bit sgid_index",
                gid.index
            )));
        }
        log::info!("{device} port {}: {}", port.number, gid.reason);
        let policy = RegPolicy {
            strict: config.strict,
            dmabuf: config.dmabuf,
            peermem: config.peermem,
            access: Access {
                relaxed_ordering: config.relaxed_ordering,
                ..Access::ALL
            },
        };
        let cache = RegCache::new(
            VerbsRegistrar::new(ctx.clone(), policy),
            config.cache_budget_bytes,
        );
        Ok(RdmaEndpoint {
            inner: Arc::new(Inner {
                ctx,
                port,
                link,
                gid,
                config,
                cache,
            }),
        })
    }

    /// RDMA device name.
    pub fn device(&self) -> &str {
        self.inner.ctx.name()
    }

    /// The port in use, as queried when the endpoint was opened.
    pub fn port(&self) -> &Port {
        &self.inner.port
    }

    /// The port's state now, as sysfs reports it (`ACTIVE`, `DOWN`, ...; `unknown` when it
    /// cannot be read).
    pub fn port_state(&self) -> String {
        let path = format!(
            "/sys/class/infiniband/{}/ports/{}/state",
            self.device(),
            self.inner.port.number
        );
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split(':').nth(1).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| "unknown".into())
    }

    /// Link layer.
    pub fn link(&self) -> LinkKind {
        self.inner.link
    }

    /// The GID in use, and why.
    pub fn gid(&self) -> &GidChoice {
        &self.inner.gid
    }

    /// Device limits.
    pub fn caps(&self) -> DeviceCaps {
        self.inner.ctx.caps()
    }

    /// The settings.
    pub fn config(&self) -> &EndpointConfig {
        &self.inner.config
    }

    /// A registration covering `mem`, from the cache or registered now. For GPU memory the
    /// handle says which mechanism worked ([`crate::Mechanism`]); in strict mode memory that
    /// only a staged path could serve is an error instead.
    pub fn register(&self, mem: &Memory) -> Result<MrHandle, RdmaError> {
        self.inner.cache.get(mem).map_err(|e| match e {
            crate::cache::CacheError::Empty => {
                RdmaError::InvalidArgument("cannot register zero bytes".into())
            }
            crate::cache::CacheError::Register(e) => e,
        })
    }

    /// Forget cached registrations overlapping `range` (call before freeing the memory).
    pub fn invalidate(&self, range: &MemRange) -> usize {
        self.inner.cache.invalidate(range)
    }

    /// Registration cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.cache.stats()
    }

    /// A completion queue with room for `entries` completions, to share among the queue
    /// pairs of one or more connections.
    pub fn completion_queue(&self, entries: u32) -> Result<CompletionQueue, RdmaError> {
        CompletionQueue::new(&self.inner.ctx, entries)
    }

    /// `qps` queue pairs (0: the configured number) in INIT on this port, reporting to `cq`;
    /// their connection data is ready to send to the peer.
    pub fn prepare(&self, cq: &CompletionQueue, qps: u16) -> Result<PreparedQp, RdmaError> {
        let qps = if qps == 0 {
            self.inner.config.qps_per_peer
        } else {
            qps
        };
        PreparedQp::new(self.clone(), cq, qps)
    }
}

/// Open an endpoint on each rail [`choose_nics`] picks for memory at `place`.
pub fn open_rails(
    topo: &Topology,
    place: &MemPlace,
    config: &EndpointConfig,
) -> Result<(NicChoice, Vec<RdmaEndpoint>), RdmaError> {
    let choice = choose_nics(topo, place)?;
    let mut eps = Vec::with_capacity(choice.rails.len());
    for r in &choice.rails {
        let mut c = config.clone();
        if c.port == 0 {
            c.port = r
                .ports
                .first()
                .and_then(|p| u8::try_from(*p).ok())
                .unwrap_or(0);
        }
        eps.push(RdmaEndpoint::open(&r.device, c)?);
    }
    Ok((choice, eps))
}
