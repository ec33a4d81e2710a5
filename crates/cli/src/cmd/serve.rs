//! `gdx serve`: a target agent. It registers one region of a given size, prints the address and
//! the region's descriptor, and serves peers (their writes, reads and notifications) until
//! stopped. Pair it with `gdx bench --peer` or an embedding program on another process or host.
//!
//! With `--rdma-listen`, a second listener answers `gdx bench --path rdma` clients (gdx-rdma's
//! bench protocol, one client at a time) on its own port: the engine's wire protocol and the
//! RDMA bench's control messages do not share a socket.

use anyhow::{Context, Result};
use clap::Args;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{Access, AgentConfig};
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Serve one registered memory region to peers (a target for transfers and benchmarks).
///
/// Prints a line `GDX_SERVE addr=<ip:port> region=gdx1:<hex> len=<bytes>` that peers (and
/// scripts) use to connect, then serves until killed. Notifications from peers are printed to
/// stderr.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx serve                           64 MiB read/write region on 0.0.0.0:7447
  gdx serve --size 1GiB --listen 127.0.0.1:0
  gdx serve --read-only --name weights
  gdx serve --rdma-listen 0.0.0.0:7448       also answer `gdx bench --path rdma --peer HOST:7448`

Environment: GDX_TRANSPORTS (tcp,shm), GDX_TCP_STREAMS, GDX_CHUNK_BYTES, GDX_IO_TIMEOUT_MS,
GDX_TIMEOUT_MS, GDX_AGENT_NAME, GDX_HOST_ID configure the agent.")]
pub struct ServeArgs {
    /// Address to accept peers on (port 0 picks a free port).
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:7447")]
    listen: SocketAddr,

    /// Size of the served region: bytes, or with a unit (KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    size: u64,

    /// Name peers look the region up by.
    #[arg(long, default_value = "serve")]
    name: String,

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
            let r = gdx_rdma::bench::serve_bench_on(
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

/// Sizes the one gdx way ([`gdx_sys::bytesize`]: `1GB` = 10^9, `1GiB` = 2^30).
pub fn parse_size(s: &str) -> Result<u64, String> {
    gdx_sys::bytesize::ByteSize::parse(s).map_err(|e| e.to_string())
}

/// Run `gdx serve`.
pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    let mut agent = AgentConfig::from_env().context("reading GDX_* settings")?;
    agent.listen = Some(args.listen);
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
    println!("{}", handle.banner());
    if let Some(l) = rdma {
        println!("GDX_SERVE_RDMA addr={}", l.local_addr()?);
        spawn_rdma(l, args.rdma_device.clone())?;
    }
    let stop = AtomicBool::new(false);
    handle.serve_forever(Some(&stop))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("0.5").is_err());
    }
}
