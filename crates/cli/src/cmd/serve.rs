//! `gdx serve`: a target agent. It registers one region of a given size, prints the address and
//! the region's descriptor, and serves peers (their writes, reads and notifications) until
//! stopped. Pair it with `gdx bench --peer` or an embedding program on another process or host.
//!
//! Peers must prove they hold the agent's secret (`--secret-file`, `GDX_SECRET_FILE`, or one
//! generated at start and printed once); `--insecure` turns that off, with a warning.
//!
//! With `--rdma-listen`, a second listener answers `gdx bench --path rdma` clients (gdx-rdma's
//! bench protocol, one client at a time) on its own port: the engine's wire protocol and the
//! RDMA bench's control messages do not share a socket.

use super::args::{parse_listen, parse_nic_list, parse_size};
use super::output::{paint, ColorWhen};
use anyhow::{Context, Result};
use clap::Args;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{Access, AgentConfig, Secret};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Serve one registered memory region to peers (a target for transfers and benchmarks).
///
/// Prints a line `GDX_SERVE addr=<ip:port> region=gdx1:<hex> len=<bytes>` that peers (and
/// scripts) use to connect, then serves until killed. Notifications from peers are printed to
/// stderr.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx serve                           64 MiB read/write region on 127.0.0.1:7447, new secret
  gdx serve --listen :7447 --secret-file /etc/gdx/secret     every interface, shared secret
  gdx serve --size 1GiB --listen 127.0.0.1:0
  gdx serve --read-only --name weights
  gdx serve --rdma-listen 0.0.0.0:7448       also answer `gdx bench --path rdma --peer HOST:7448`
  gdx serve --etcd http://127.0.0.1:2379 --cluster demo --agent prefill-0 --metrics 127.0.0.1:9464
                                      register in etcd (lease 10 s), /metrics and /health

Security: peers prove they hold the secret (SPAKE2: no guess can be tested offline) before they
learn any region or key; bulk data is NOT encrypted. Make a secret with `gdx secret --out FILE`
and give clients the same one with GDX_SECRET_FILE=<file> (mode 600).

Environment: GDX_TRANSPORTS (tcp,shm), GDX_TCP_STREAMS, GDX_CHUNK_BYTES, GDX_IO_TIMEOUT_MS,
GDX_TIMEOUT_MS, GDX_AGENT_NAME, GDX_HOST_ID, GDX_SECRET_FILE, GDX_HANDSHAKE_TIMEOUT_MS,
GDX_IDLE_TIMEOUT_MS, GDX_MAX_CONNECTIONS configure the agent.")]
pub struct ServeArgs {
    /// Address to accept peers on: PORT (loopback), :PORT (every IPv4 interface), HOST:PORT,
    /// [IPv6]:PORT. Port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7447", value_parser = parse_listen)]
    listen: SocketAddr,

    /// File holding the secret peers must prove they hold (mode 600; at least 16 bytes).
    /// Default: GDX_SECRET_FILE, else a secret generated now and printed once.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    secret_file: Option<PathBuf>,

    /// No authentication: any client that connects gets the region and its key. For
    /// isolated, trusted networks only; clients must be insecure too (GDX_INSECURE=1).
    #[arg(long)]
    insecure: bool,

    /// Most inbound connections at once (control, data streams and shm sockets together).
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,

    /// Close a connection that has not authenticated within this many milliseconds.
    #[arg(long, value_name = "MS")]
    handshake_timeout_ms: Option<u64>,

    /// Close an authenticated connection idle for this many milliseconds.
    #[arg(long, value_name = "MS")]
    idle_timeout_ms: Option<u64>,

    /// Size of the served region: bytes, or with a unit (KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    size: u64,

    /// Name peers look the region up by.
    #[arg(long, default_value = "serve")]
    name: String,

    /// Print the startup facts as one JSON object on stdout (addr, agent, region, desc, secret
    /// when generated), then serve.
    #[arg(long)]
    json: bool,

    /// Print only the machine-readable lines (GDX_SERVE, GDX_SERVE_SECRET, GDX_SERVE_RDMA).
    #[arg(long, short)]
    quiet: bool,

    /// Colour for warnings: auto (only on a terminal, and not under NO_COLOR), always or never.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ColorWhen::Auto)]
    color: ColorWhen,

    /// Let peers read but not write the region.
    #[arg(long)]
    read_only: bool,

    /// Also answer RDMA bench clients (`gdx bench --path rdma --peer HOST:PORT`) on this
    /// address, one at a time; prints `GDX_SERVE_RDMA addr=<ip:port>`. Without an RDMA device
    /// here each client is told why. Never run on hardware.
    #[arg(long, value_name = "IP:PORT")]
    rdma_listen: Option<SocketAddr>,

    /// RDMA device for --rdma-listen (default: the NIC nearest to the memory a client asks for).
    #[arg(long, value_name = "NAME", requires = "rdma_listen")]
    rdma_device: Option<String>,

    /// Rails of the connections this agent makes, in order (`AgentConfig::nics`; default
    /// $GDX_NICS): tcp `LOCAL_IP` or `LOCAL_IP=REMOTE_IP[:PORT]`. The initiator picks the rails
    /// of a connection: a served agent only accepts on --listen.
    #[arg(long, value_name = "A,B", value_parser = parse_nic_list)]
    nics: Option<String>,

    #[command(flatten)]
    cluster: super::cluster::ServeClusterArgs,
}

/// Wait limit of each step of an RDMA bench client.
const RDMA_STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Answer RDMA bench clients on `listener` in a background thread, logging each to stderr.
fn spawn_rdma(listener: TcpListener, device: Option<String>) -> Result<()> {
    if let Err(u) = gdx_rdma::discover() {
        eprintln!("gdx serve: warning: --rdma-listen: {u}; RDMA bench clients are told so");
    }
    std::thread::Builder::new()
        .name("gdx-serve-rdma".into())
        .spawn(move || {
            let cfg = gdx_rdma::EndpointConfig::default();
            let mut log = |peer: SocketAddr, r: Result<(), gdx_rdma::RdmaError>| match r {
                Ok(()) => eprintln!("gdx serve: RDMA bench client {peer}: done"),
                Err(e) => eprintln!("gdx serve: RDMA bench client {peer}: {e}"),
            };
            let r = gdx_bench::rdma::serve_on(
                &listener,
                device.as_deref(),
                &cfg,
                RDMA_STEP_TIMEOUT,
                &mut log,
            );
            if let Err(e) = r {
                eprintln!("gdx serve: --rdma-listen stopped: {e}");
            }
        })
        .context("starting the RDMA bench listener")?;
    Ok(())
}

/// Run `gdx serve`.
pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    super::logger::init()?;
    let mut agent = AgentConfig::from_env().context("reading GDX_* settings")?;
    agent.listen = Some(args.listen);
    if let Some(n) = &args.cluster.agent {
        agent.name = n.clone();
    }
    if let Some(f) = &args.secret_file {
        agent.secret = Some(Secret::from_file(f).context("--secret-file")?);
    }
    let generated = if args.insecure {
        agent.insecure = true;
        agent.secret = None;
        None
    } else if agent.secret.is_none() {
        let s = Secret::generate().context("generating a secret")?;
        agent.secret = Some(s.clone());
        Some(s)
    } else {
        None
    };
    if let Some(n) = &args.nics {
        agent.nics = gdx_engine::parse_nics(n);
    }
    if let Some(n) = args.max_connections {
        agent.limits.max_connections = n;
    }
    if let Some(ms) = args.handshake_timeout_ms {
        agent.limits.handshake_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = args.idle_timeout_ms {
        agent.limits.idle_timeout = Duration::from_millis(ms);
    }
    let cfg = ServeConfig {
        agent,
        region_len: args.size,
        region_name: args.name.clone(),
        access: if args.read_only {
            Access::READ
        } else {
            Access::READ_WRITE
        },
    };
    let rdma = match args.rdma_listen {
        Some(a) => Some(TcpListener::bind(a).with_context(|| format!("--rdma-listen {a}"))?),
        None => None,
    };
    let handle = serve::run(cfg).with_context(|| format!("serving on {}", args.listen))?;
    // Before the banner: whoever reads the GDX_SERVE line has been warned already.
    if args.insecure {
        // Warned even with -q: it is the one thing an operator must not miss.
        eprintln!(
            "gdx serve: {}: --insecure: no authentication; anyone who can reach {} gets the \
             region key and its bytes",
            paint(args.color.enabled_on_stderr(), "1;31", "WARNING"),
            handle.addr()
        );
    }
    let rdma_addr = match &rdma {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    if args.json {
        let d = handle.desc();
        let v = serde_json::json!({
            "addr": handle.addr().to_string(),
            "region": {
                "name": d.name,
                "len": d.len,
                "location": d.location.to_string(),
                "remote_read": d.access.remote_read,
                "remote_write": d.access.remote_write,
            },
            "desc": d.to_string(),
            "secret": generated.as_ref().map(|s| s.reveal()),
            "insecure": args.insecure,
            "rdma_addr": rdma_addr.map(|a| a.to_string()),
        });
        println!("{}", super::output::json_safe(&v.to_string()));
    } else {
        if args.quiet {
            println!("{}", handle.summary_line());
        } else {
            println!("{}", handle.banner());
        }
        if let Some(s) = &generated {
            // Shown once, for the operator to hand to peers; never written anywhere by us.
            println!(
                "GDX_SERVE_SECRET {} (generated for this run: save it to a file with mode 600 and \
                 give peers GDX_SECRET_FILE=<file>)",
                s.reveal()
            );
        }
        if let Some(a) = rdma_addr {
            println!("GDX_SERVE_RDMA addr={a}");
        }
    }
    // Scripts read these lines through a pipe: make sure they leave now, not at exit.
    std::io::Write::flush(&mut std::io::stdout())?;
    if let Some(l) = rdma {
        spawn_rdma(l, args.rdma_device.clone())?;
    }
    let cluster = super::cluster::attach(&args.cluster, handle.shared_agent())?;
    let stop = cluster.stop_flag()?;
    handle.serve_forever(Some(&stop))?;
    // SIGINT/SIGTERM with --etcd: leave the cluster now rather than when the lease expires.
    cluster.leave();
    Ok(ExitCode::SUCCESS)
}
