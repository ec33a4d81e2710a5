//! A real etcd for tests: [`EtcdServer`] starts Debian's `etcd` (package `etcd-server`) on
//! free loopback ports with a temporary data dir, and kills it on drop. Never a home-made
//! registry: the tests exercise the real lease and watch semantics.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{ClusterError, Result};

/// A running etcd on loopback.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| ClusterError::io("bind", e))?;
    Ok(l.local_addr()
        .map_err(|e| ClusterError::io("getsockname", e))?
        .port())
}

/// The etcd binary: `$GDX_ETCD_BIN`, else `etcd` on PATH.
fn etcd_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GDX_ETCD_BIN") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            ClusterError::io(
                "etcd not found on PATH: install Debian's etcd-server package \
                 (scripts/bootstrap.sh and .ci/run install it)",
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })
}

impl EtcdServer {
    /// Starts etcd and waits (up to 30 s) until its client port answers.
    ///
    /// # Errors
    /// [`ClusterError::Io`] naming the package when `etcd` is missing, or with etcd's log
    /// when it does not come up.
    pub fn start() -> Result<EtcdServer> {
        let dir = tempfile::tempdir().map_err(|e| ClusterError::io("temp dir", e))?;
        let mut s = EtcdServer {
            child: None,
            dir,
            client_port: free_port()?,
            peer_port: free_port()?,
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> Result<()> {
        let bin = etcd_bin()?;
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .map_err(|e| ClusterError::io("etcd log file", e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| ClusterError::io("etcd log file", e))?;
        let child = Command::new(&bin)
            .arg("--name=gdx-test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=gdx-test={peer}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| ClusterError::io(format!("starting {}", bin.display()), e))?;
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.client_port));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                && crate::ClusterView::connect(&crate::EtcdOptions::new(self.url()), "probe")
                    .is_ok()
            {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(ClusterError::io(
                        format!("etcd exited ({st}): {}", self.log()),
                        std::io::Error::other("etcd did not start"),
                    ));
                }
            }
            if Instant::now() > deadline {
                return Err(ClusterError::io(
                    format!("etcd did not answer within 30 s: {}", self.log()),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last 2,000 bytes of etcd's log.
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let cut = s.len().saturating_sub(2000);
        s.get(cut..).unwrap_or_default().to_string()
    }

    /// The client URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd with SIGKILL and reaps it (the data dir stays, for [`EtcdServer::restart`]).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data dir.
    ///
    /// # Errors
    /// As [`EtcdServer::start`].
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
