//! `gdx serve`: a target agent that registers one region and waits for peers.
//!
//! The CLI is a thin user of this module:
//!
//! ```no_run
//! use gdx_engine::serve::{self, ServeConfig};
//! let mut cfg = ServeConfig::default();
//! cfg.agent.listen = Some("0.0.0.0:7447".parse().unwrap());
//! cfg.region_len = 1 << 30;
//! let handle = serve::run(cfg)?;
//! println!("{}", handle.banner());
//! handle.serve_forever(None)?; // prints notifications to stderr; returns when the stop flag is set
//! # Ok::<(), gdx_engine::Error>(())
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::agent::Agent;
use crate::config::AgentConfig;
use crate::error::{Error, Result};
use crate::region::{Access, Region, RegionDesc};

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The agent's configuration; set `listen` to the address to accept on.
    pub agent: AgentConfig,
    /// Size of the served region in bytes.
    pub region_len: u64,
    /// Name the region is published under (peers call `Peer::region(name)`).
    pub region_name: String,
    /// What peers may do with the region.
    pub access: Access,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            agent: AgentConfig::default(),
            region_len: 64 << 20,
            region_name: "serve".into(),
            access: Access::READ_WRITE,
        }
    }
}

/// A running server: the agent and its region. Dropping it stops serving.
#[derive(Debug)]
pub struct ServeHandle {
    region: Region<'static>,
    // Shared so that a cluster registration or a metrics exporter can hold the agent too.
    agent: Arc<Agent>,
}

/// Starts an agent listening on `cfg.agent.listen` with one agent-allocated region published as
/// `cfg.region_name`.
///
/// # Errors
/// [`Error::InvalidArgument`] when `listen` is `None` or the config is bad; [`Error::Os`] when the
/// address cannot be bound or the memory cannot be allocated.
pub fn run(cfg: ServeConfig) -> Result<ServeHandle> {
    if cfg.agent.listen.is_none() {
        return Err(Error::InvalidArgument(
            "serve needs a listen address".into(),
        ));
    }
    let agent = Agent::new(cfg.agent)?;
    let region = agent.alloc(cfg.region_len, cfg.access, Some(&cfg.region_name))?;
    Ok(ServeHandle {
        region,
        agent: Arc::new(agent),
    })
}

impl ServeHandle {
    /// The address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.agent
            .listen_addr()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The served region's descriptor (also fetchable by name through `Peer::region`).
    pub fn desc(&self) -> RegionDesc {
        self.region.desc()
    }

    /// The agent.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The agent, shared (for gdx-cluster's registration and metrics, which outlive a borrow).
    pub fn shared_agent(&self) -> Arc<Agent> {
        Arc::clone(&self.agent)
    }

    /// The served region (to inspect what peers wrote or to fill what they read).
    pub fn region(&mut self) -> &mut Region<'static> {
        &mut self.region
    }

    /// One machine-readable line: `GDX_SERVE addr=<ip:port> region=<gdx1:token> len=<bytes>`.
    pub fn summary_line(&self) -> String {
        format!(
            "GDX_SERVE addr={} region={} len={}",
            self.addr(),
            self.desc(),
            self.region.len()
        )
    }

    /// Human-readable lines for the CLI: address, region, how to connect; ends with
    /// [`ServeHandle::summary_line`].
    pub fn banner(&self) -> String {
        let d = self.desc();
        let access = match (d.access.remote_read, d.access.remote_write) {
            (true, true) => "read+write",
            (true, false) => "read",
            (false, true) => "write",
            (false, false) => "none",
        };
        format!(
            "gdx serve: agent {:?} listening on {}\nregion {:?}: {} bytes of {} memory, peers may {}\n{}",
            self.agent.name(),
            self.addr(),
            d.name.as_deref().unwrap_or(""),
            d.len,
            d.location,
            access,
            self.summary_line()
        )
    }

    /// Serves until `stop` is set (never, if `None`), printing each notification to stderr.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for fatal listener errors.
    pub fn serve_forever(&self, stop: Option<&AtomicBool>) -> Result<()> {
        loop {
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Ok(());
            }
            match self.agent.wait_notification(Duration::from_millis(200)) {
                // The name and the data are the peer's: escaped, so they cannot drive the
                // operator's terminal.
                Ok(n) => eprintln!(
                    "notification from {}: {}",
                    gdx_topo::printable(&n.from),
                    gdx_topo::printable(&String::from_utf8_lossy(&n.data))
                ),
                Err(Error::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
}
