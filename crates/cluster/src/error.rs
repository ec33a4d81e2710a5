//! The crate's one error type.

/// Result alias used throughout the crate.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// Everything that can go wrong in cluster membership, lookups and the metrics endpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// etcd did not answer (down, unreachable, wrong URL); `what` says which step.
    #[error("etcd at {endpoints} unreachable while {what}: {source}")]
    Unreachable {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The step that failed ("granting a lease", "reading the cluster" ...).
        what: &'static str,
        /// etcd-client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// An etcd call failed for a reason other than reachability (bad credentials, lease gone).
    #[error("etcd: {what}: {source}")]
    Etcd {
        /// The step that failed.
        what: &'static str,
        /// etcd-client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// Another live agent holds the name.
    #[error(
        "agent name {name:?} in cluster {cluster:?} is taken by instance {holder_instance} \
         (listening on {holder_listen}, pid {holder_pid}); pick another --agent name, or stop it"
    )]
    NameTaken {
        /// The cluster.
        cluster: String,
        /// The name asked for.
        name: String,
        /// Instance id of the holder.
        holder_instance: String,
        /// Where the holder listens.
        holder_listen: String,
        /// The holder's process id.
        holder_pid: u32,
    },
    /// No live agent of this name is registered in the cluster.
    #[error("no agent named {name:?} in cluster {cluster:?}")]
    NoSuchAgent {
        /// The cluster.
        cluster: String,
        /// The name looked up.
        name: String,
    },
    /// The agent answering at the published address is not the instance etcd names (it was
    /// restarted or replaced between the lookup and the handshake).
    #[error("agent {name:?} at {addr}: etcd names instance {expected}, the peer is {found}")]
    InstanceMismatch {
        /// The agent name.
        name: String,
        /// Address connected to.
        addr: String,
        /// The instance etcd lists.
        expected: String,
        /// The instance that answered.
        found: String,
    },
    /// A record in etcd could not be decoded (written by another tool, or another version).
    #[error("malformed record at {key}: {message}")]
    Malformed {
        /// The etcd key.
        key: String,
        /// What was wrong.
        message: String,
    },
    /// An argument is invalid (empty cluster name, a name with '/', an agent without listener).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The engine failed (connecting, fetching a descriptor, transferring).
    #[error(transparent)]
    Engine(#[from] gdx_engine::Error),
    /// An operating-system step failed (spawning a thread, binding the metrics port, starting
    /// etcd in the test helper).
    #[error("{what}: {source}")]
    Io {
        /// The step that failed.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A metric could not be registered or encoded.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

impl ClusterError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ClusterError::Io {
            what: what.into(),
            source,
        }
    }
}
