//! `Agent.join_cluster` / `Agent.connect_named`: gdx-cluster's etcd discovery from Python.
//!
//! The agent is published under its name on a lease (`ClusterAgent::join`), with the regions it
//! has published by then; peers are found by name (`connect_named`), which checks that the
//! instance answering is the one etcd lists. Everything here is gdx-cluster's own behaviour.

use std::sync::Arc;
use std::time::Duration;

use gdx_cluster::{ClusterAgent, ClusterConfig, ClusterError, EtcdOptions};
use gdx_engine::Agent;
use pyo3::prelude::*;

use crate::errors::{err, to_py, NotFound, Unavailable};

/// Maps gdx-cluster's error to the package's exceptions: a name etcd does not list is
/// `NotFound`, an unreachable etcd `Unavailable`, an engine error its own class.
pub(crate) fn cluster_to_py(e: ClusterError) -> PyErr {
    let msg = e.to_string();
    match e {
        ClusterError::Engine(e) => to_py(e),
        ClusterError::NoSuchAgent { .. } => NotFound::new_err(msg),
        ClusterError::Unreachable { .. } => Unavailable::new_err(msg),
        _ => err(msg),
    }
}

/// Joins `cluster` at the comma-separated etcd URLs `etcd`, publishing `agent` under its name.
pub(crate) fn join(
    py: Python<'_>,
    agent: Arc<Agent>,
    etcd: &str,
    cluster: &str,
    ttl_s: i64,
    timeout: Duration,
) -> PyResult<ClusterAgent> {
    let mut opts = EtcdOptions::new(etcd);
    opts.endpoints = etcd.split(',').map(|u| u.trim().to_string()).collect();
    opts.timeout = timeout;
    let mut cfg = ClusterConfig::new(opts, cluster);
    cfg.ttl_s = ttl_s;
    py.allow_threads(move || ClusterAgent::join(agent, cfg))
        .map_err(cluster_to_py)
}
