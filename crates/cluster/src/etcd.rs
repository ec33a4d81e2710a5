//! A blocking face over etcd-client: one small tokio runtime per connection runs the gRPC
//! client and the background tasks (lease keep-alive, watches), so callers and the engine
//! never see async.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::runtime::Runtime;

use crate::error::{ClusterError, Result};

/// TLS to etcd: the CA that signed etcd's certificate, and a client certificate for etcd's
/// `--client-cert-auth`. PEM bytes.
#[derive(Clone, Default)]
pub struct EtcdTls {
    /// CA certificate(s) to trust for etcd's server certificate.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key stays out of logs.
        f.debug_struct("EtcdTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.identity.is_some())
            .finish()
    }
}

/// How to reach etcd. etcd's own authentication (user and password, TLS with client
/// certificates) is passed through.
#[derive(Clone)]
pub struct EtcdOptions {
    /// Client URLs (`http://127.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// etcd user and password, for clusters with auth enabled.
    pub user: Option<(String, String)>,
    /// Bound on each etcd request and on connecting (default 3 s): a dead etcd must not hang
    /// an agent's start or its keep-alive loop.
    pub timeout: Duration,
    /// TLS (for `https://` endpoints).
    pub tls: Option<EtcdTls>,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password stays out of logs.
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|u| &u.0))
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdOptions {
    /// Options for one endpoint URL, no auth, default timeout.
    pub fn new(url: impl Into<String>) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![url.into()],
            user: None,
            timeout: Duration::from_secs(3),
            tls: None,
        }
    }
}

/// A connected client and the runtime its futures run on. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Etcd {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) client: Client,
    pub(crate) endpoints: String,
    pub(crate) timeout: Duration,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

/// Whether an etcd-client error means "etcd did not answer" rather than "etcd said no".
pub(crate) fn is_unreachable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // gRPC codes 1 (cancelled), 4 (deadline exceeded), 14 (unavailable): tonic's `Code`
        // converts to its wire number, which spares this crate a direct tonic dependency.
        etcd_client::Error::GRpcStatus(s) => matches!(i32::from(s.code()), 1 | 4 | 14),
        _ => false,
    }
}

impl Etcd {
    /// Starts the runtime and connects. Connecting is lazy in tonic, so this also reads one key
    /// to fail fast, with a clear error, when etcd is not there.
    pub(crate) fn connect(opts: &EtcdOptions) -> Result<Etcd> {
        let endpoints = opts.endpoints.join(",");
        if opts.endpoints.is_empty() {
            return Err(ClusterError::InvalidArgument(
                "no etcd endpoint given".into(),
            ));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gdx-etcd")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::io("starting the etcd client runtime", e))?;
        let mut co = ConnectOptions::new()
            .with_connect_timeout(opts.timeout)
            .with_timeout(opts.timeout);
        if let Some((u, p)) = &opts.user {
            co = co.with_user(u.clone(), p.clone());
        }
        if let Some(tls) = &opts.tls {
            let mut t = etcd_client::TlsOptions::new();
            if let Some(ca) = &tls.ca_pem {
                t = t.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(etcd_client::Identity::from_pem(cert, key));
            }
            co = co.with_tls(t);
        }
        let timeout = opts.timeout;
        let eps = opts.endpoints.clone();
        let client = rt
            .block_on(async move {
                let mut c = tokio::time::timeout(timeout, Client::connect(eps, Some(co)))
                    .await
                    .map_err(|_| etcd_client::Error::InvalidArgs("connect timed out".into()))??;
                c.get(
                    "/gdx/",
                    Some(
                        etcd_client::GetOptions::new()
                            .with_keys_only()
                            .with_limit(1),
                    ),
                )
                .await?;
                Ok::<_, etcd_client::Error>(c)
            })
            .map_err(|source| ClusterError::Unreachable {
                endpoints: endpoints.clone(),
                what: "connecting",
                source,
            })?;
        Ok(Etcd {
            rt: Arc::new(rt),
            client,
            endpoints,
            timeout,
        })
    }

    /// Runs `f` on the runtime from a plain thread.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Maps an etcd-client error of step `what`.
    pub(crate) fn err(&self, what: &'static str, source: etcd_client::Error) -> ClusterError {
        if is_unreachable(&source) {
            ClusterError::Unreachable {
                endpoints: self.endpoints.clone(),
                what,
                source,
            }
        } else {
            ClusterError::Etcd { what, source }
        }
    }
}
