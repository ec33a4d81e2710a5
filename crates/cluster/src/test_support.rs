//! A real etcd for tests: [`EtcdServer`] starts Debian's `etcd` (package `etcd-server`) on
//! free loopback ports with a temporary data dir, and kills it on drop. Never a home-made
//! registry: the tests exercise the real lease and watch semantics.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
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
    /// With TLS: the PEM files (CA, server and client certificates) in `dir`.
    tls: bool,
}

/// Runs `openssl ARGS` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| {
            ClusterError::io(
                "running openssl (install Debian's openssl package) to make test certificates",
                e,
            )
        })?;
    if !out.status.success() {
        return Err(ClusterError::io(
            format!(
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ),
            std::io::Error::other("openssl failed"),
        ));
    }
    Ok(())
}

/// A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`.
fn make_certs(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=gdx-test-ca",
        ],
    )?;
    for (name, usage) in [
        ("server", "serverAuth,clientAuth"),
        ("client", "clientAuth"),
    ] {
        let ext = format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n");
        std::fs::write(dir.join(format!("{name}.ext")), ext)
            .map_err(|e| ClusterError::io("writing a certificate extension file", e))?;
        let (key, csr, pem, extf) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN=gdx-test-{name}"),
            ],
        )?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &extf,
            ],
        )?;
    }
    Ok(())
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
            tls: false,
        };
        s.spawn()?;
        Ok(s)
    }

    /// Like [`EtcdServer::start`], serving clients over TLS and requiring a client certificate
    /// (certificates made with `openssl` in the temp dir; see [`EtcdServer::client_tls`]).
    ///
    /// # Errors
    /// As [`EtcdServer::start`], and when `openssl` is missing or fails.
    pub fn start_tls() -> Result<EtcdServer> {
        let dir = tempfile::tempdir().map_err(|e| ClusterError::io("temp dir", e))?;
        make_certs(dir.path())?;
        let mut s = EtcdServer {
            child: None,
            dir,
            client_port: free_port()?,
            peer_port: free_port()?,
            tls: true,
        };
        s.spawn()?;
        Ok(s)
    }

    /// The TLS options a client of a [`EtcdServer::start_tls`] server needs (`None` without
    /// TLS).
    pub fn client_tls(&self) -> Option<crate::EtcdTls> {
        if !self.tls {
            return None;
        }
        let read = |n: &str| std::fs::read(self.dir.path().join(n)).ok();
        Some(crate::EtcdTls {
            ca_pem: read("ca.pem"),
            identity: read("client.pem").zip(read("client.key")),
        })
    }

    /// Client options for this server (URL, and TLS when it has it).
    pub fn options(&self) -> crate::EtcdOptions {
        let mut o = crate::EtcdOptions::new(self.url());
        o.tls = self.client_tls();
        o
    }

    /// The directory of the PEM files of a TLS server (`ca.pem`, `client.pem`, `client.key`).
    pub fn cert_dir(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self) -> Result<()> {
        let bin = etcd_bin()?;
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .map_err(|e| ClusterError::io("etcd log file", e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| ClusterError::io("etcd log file", e))?;
        let mut cmd = Command::new(&bin);
        if self.tls {
            let f = |n: &str| self.dir.path().join(n).display().to_string();
            cmd.arg(format!("--cert-file={}", f("server.pem")))
                .arg(format!("--key-file={}", f("server.key")))
                .arg(format!("--trusted-ca-file={}", f("ca.pem")))
                .arg("--client-cert-auth");
        }
        let child = cmd
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
                && crate::ClusterView::connect(&self.options(), "probe").is_ok()
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

    /// The client URL (`http://127.0.0.1:PORT`, `https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Writes `value` under `key` with a plain put through etcd's JSON gateway (no lease), as
    /// any client with write access could: for tests of forged records. Plain-text etcd only.
    ///
    /// # Errors
    /// [`ClusterError::Io`] when etcd cannot be reached or does not answer 200.
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        use std::io::{Read, Write};
        let io = |e| ClusterError::io("etcd put (test support)", e);
        let hostport = format!("127.0.0.1:{}", self.client_port);
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            base64(key.as_bytes()),
            base64(value.as_bytes())
        );
        let mut s = TcpStream::connect(&hostport).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io)?;
        write!(
            s,
            "POST /v3/kv/put HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .map_err(io)?;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        if out.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(io(std::io::Error::other(format!("etcd answered: {out}"))))
        }
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

/// Standard base64 with padding (etcd's JSON gateway takes keys and values so).
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let at = |i: usize| u32::from(c.get(i).copied().unwrap_or(0));
        let n = (at(0) << 16) | (at(1) << 8) | at(2);
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod base64_tests {
    #[test]
    fn rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(i.as_bytes()), o);
        }
    }
}
