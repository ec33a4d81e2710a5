//! Cluster flags shared by `gdx serve` and `gdx peers`, and the serve side's registration:
//! join etcd, serve `/metrics` and `/health`, and report registration changes on stderr.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use gdx_cluster::metrics::{Health, MetricsServer};
use gdx_cluster::{ClusterAgent, ClusterConfig, EtcdOptions, EtcdTls, LeaseState};
use gdx_engine::Agent;

/// How to reach etcd.
#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// etcd client URL(s), comma-separated (`http://127.0.0.1:2379`).
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    pub etcd: Vec<String>,

    /// etcd user, for clusters with etcd auth enabled (with --etcd-password-file).
    #[arg(long, value_name = "USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,

    /// File holding the etcd user's password (kept off the command line).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,

    /// CA certificate (PEM) that signed etcd's server certificate, for `https://` endpoints.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,

    /// Client certificate (PEM) for etcd's `--client-cert-auth` (with --etcd-key).
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,

    /// Private key (PEM) of --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,

    /// Bound on each etcd request, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    pub etcd_timeout_ms: u64,
}

impl EtcdArgs {
    /// The client options, or `None` without `--etcd`.
    pub fn options(&self) -> Result<Option<EtcdOptions>> {
        if self.etcd.is_empty() {
            return Ok(None);
        }
        let user = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(u), Some(f)) => {
                let p = std::fs::read_to_string(f)
                    .with_context(|| format!("--etcd-password-file {}", f.display()))?;
                Some((u.clone(), p.trim_end_matches(['\n', '\r']).to_string()))
            }
            _ => None,
        };
        let read = |f: &PathBuf, flag: &str| {
            std::fs::read(f).with_context(|| format!("{flag} {}", f.display()))
        };
        let tls = if self.etcd_ca.is_some() || self.etcd_cert.is_some() {
            let identity = match (&self.etcd_cert, &self.etcd_key) {
                (Some(c), Some(k)) => Some((read(c, "--etcd-cert")?, read(k, "--etcd-key")?)),
                _ => None,
            };
            let ca_pem = match &self.etcd_ca {
                Some(f) => Some(read(f, "--etcd-ca")?),
                None => None,
            };
            Some(EtcdTls { ca_pem, identity })
        } else {
            None
        };
        Ok(Some(EtcdOptions {
            endpoints: self.etcd.clone(),
            user,
            timeout: Duration::from_millis(self.etcd_timeout_ms),
            tls,
        }))
    }
}

/// `gdx serve`'s cluster and metrics flags.
#[derive(Args, Debug, Clone)]
pub struct ServeClusterArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Cluster to join (the `/gdx/<cluster>/` prefix in etcd).
    #[arg(long, value_name = "NAME", requires = "etcd")]
    pub cluster: Option<String>,

    /// This agent's name in the cluster (unique while its lease lives). Default:
    /// GDX_AGENT_NAME, else the engine's default name. (`--name` names the region.)
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,

    /// Lease TTL in seconds: a crashed agent's keys go this long after its last keep-alive.
    #[arg(long, value_name = "SECS", default_value_t = 10, requires = "etcd")]
    pub lease_ttl: i64,

    /// Serve without registration when etcd is unreachable at start (instead of exiting).
    #[arg(long, requires = "etcd")]
    pub etcd_optional: bool,

    /// Serve `/metrics` (Prometheus text) and `/health` on this address (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

/// `--peer etcd:AGENT` for commands that take a peer address (`gdx bench`).
#[derive(Args, Debug, Clone)]
pub struct PeerLookupArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Cluster to look `--peer etcd:AGENT` up in.
    #[arg(long, value_name = "NAME", requires = "etcd")]
    pub cluster: Option<String>,
}

impl PeerLookupArgs {
    /// `peer` itself, or for `etcd:AGENT` the address that agent published and the agent every
    /// later connection must reach (its name, cluster, and the instance the check proved).
    pub fn resolve(&self, peer: &str) -> Result<(String, Option<gdx_engine::Expected>)> {
        let Some(name) = peer.strip_prefix("etcd:") else {
            return Ok((peer.to_string(), None));
        };
        let opts = self
            .etcd
            .options()?
            .context("--peer etcd:AGENT needs --etcd URL and --cluster NAME")?;
        let cluster = self
            .cluster
            .as_deref()
            .context("--peer etcd:AGENT needs --cluster NAME")?;
        let rec = gdx_cluster::ClusterView::connect(&opts, cluster)?.lookup(name)?;
        eprintln!(
            "gdx: peer {} (instance {}) is at {} (from etcd)",
            gdx_topo::printable(name),
            gdx_topo::printable(&rec.instance),
            gdx_topo::printable(&rec.listen)
        );
        // Whoever can write etcd could point the name at another agent: check, through an
        // authenticated handshake, that the agent at that address is the one asked for.
        let probe = gdx_engine::Agent::new(gdx_engine::AgentConfig {
            listen: None,
            ..gdx_engine::AgentConfig::from_env().context("reading GDX_* settings")?
        })
        .context("starting an agent to check the peer")?;
        let mut expect = gdx_engine::Expected {
            name: name.to_string(),
            agent_id: u128::from_str_radix(&rec.instance, 16).ok(),
            cluster: Some(cluster.to_string()),
        };
        let peer = probe
            .connect_expecting(rec.listen.as_str(), &expect)
            .with_context(|| format!("--peer etcd:{}", gdx_topo::printable(name)))?;
        // Every connection of the run must reach this same proved instance: a record rewritten
        // (or an agent restarted) after this check is refused in that connection's handshake.
        expect.agent_id = Some(peer.info().agent_id);
        peer.close();
        Ok((rec.listen, Some(expect)))
    }
}

/// What keeps the registration and the endpoint alive while serving.
pub struct Attached {
    cluster: Option<ClusterAgent>,
    _metrics: Option<MetricsServer>,
}

impl Attached {
    /// The flag that ends serving: set by SIGINT/SIGTERM when in a cluster (so that the lease
    /// is revoked on the way out), never set otherwise (serving ends when the process is
    /// killed, as before).
    pub fn stop_flag(&self) -> Result<Arc<AtomicBool>> {
        let stop = Arc::new(AtomicBool::new(false));
        if self.cluster.is_some() {
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, Arc::clone(&stop))
                    .context("installing the SIGINT/SIGTERM handler")?;
            }
        }
        Ok(stop)
    }

    /// Revokes the lease (the agent's keys go at once) and says so.
    pub fn leave(self) {
        if let Some(c) = self.cluster {
            match c.leave() {
                Ok(()) => eprintln!("gdx serve: stopping; left the cluster (lease revoked)"),
                Err(e) => eprintln!("gdx serve: stopping; {e} (the lease expires by itself)"),
            }
        }
    }
}

fn describe_devices() -> (Vec<String>, Vec<String>) {
    match gdx_topo::discover() {
        Ok(t) => {
            let list = |k| {
                t.of_kind(k)
                    .map(|d| match &d.name {
                        Some(n) => format!("{} {n}", d.label),
                        None => d.label.clone(),
                    })
                    .collect()
            };
            (
                list(gdx_topo::DeviceKind::Gpu),
                list(gdx_topo::DeviceKind::Nic),
            )
        }
        Err(e) => {
            eprintln!("gdx serve: warning: topology unavailable, no GPUs/NICs listed: {e}");
            (Vec::new(), Vec::new())
        }
    }
}

/// Prints each change of the registration (lost, back) to stderr.
fn report_changes(health: Health) {
    let spawned = std::thread::Builder::new()
        .name("gdx-serve-lease".into())
        .spawn(move || {
            let mut last = health.lease_state();
            loop {
                std::thread::sleep(Duration::from_millis(250));
                let now = health.lease_state();
                if now != last {
                    match &now {
                        Some(LeaseState::Registered { lease }) => {
                            eprintln!("gdx serve: registered in etcd again (lease {lease:x})")
                        }
                        Some(LeaseState::Lost { reason }) => eprintln!(
                            "gdx serve: etcd registration lost: {reason}; still serving connected \
                             peers, retrying with backoff"
                        ),
                        _ => {}
                    }
                    last = now;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("gdx serve: warning: cannot report registration changes: {e}");
    }
}

/// Joins the cluster (with `--etcd`) and starts the metrics endpoint (with `--metrics`).
pub fn attach(args: &ServeClusterArgs, agent: Arc<Agent>) -> Result<Attached> {
    let cluster = match args.etcd.options()? {
        Some(etcd) => {
            let name = args
                .cluster
                .clone()
                .context("--etcd needs --cluster NAME (the cluster to join)")?;
            let (gpus, nics) = describe_devices();
            let cfg = ClusterConfig {
                etcd,
                cluster: name.clone(),
                ttl_s: args.lease_ttl,
                optional: args.etcd_optional,
                gpus,
                nics,
            };
            let ca = ClusterAgent::join(Arc::clone(&agent), cfg)
                .with_context(|| format!("joining cluster {name:?}"))?;
            match ca.lease_state() {
                LeaseState::Disabled { reason } => eprintln!(
                    "gdx serve: warning: running WITHOUT cluster registration (--etcd-optional): \
                     {reason}"
                ),
                s => println!(
                    "GDX_CLUSTER cluster={name} agent={} instance={} lease={}",
                    agent.name(),
                    ca.instance(),
                    match s {
                        LeaseState::Registered { lease } => format!("{lease:x}"),
                        other => format!("{other:?}"),
                    }
                ),
            }
            report_changes(ca.health());
            Some(ca)
        }
        None => None,
    };
    let metrics = match args.metrics {
        Some(addr) => {
            let health = match &cluster {
                Some(c) => c.health(),
                None => Health::agent_only(Arc::clone(&agent)),
            };
            let m = MetricsServer::start(addr, health).context("--metrics")?;
            println!("GDX_METRICS addr={}", m.addr());
            Some(m)
        }
        None => None,
    };
    Ok(Attached {
        cluster,
        _metrics: metrics,
    })
}
