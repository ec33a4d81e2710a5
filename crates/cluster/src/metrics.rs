//! `/metrics` (Prometheus text format) and `/health` on a loopback port.
//!
//! Every counter comes from the engine ([`gdx_engine::Agent::stats`]), read at scrape time:
//! bytes and ops by path and direction, failed ops by reason, transfers by outcome, transfer
//! latency, peers connected; plus the lease state from the cluster registration.

use std::net::SocketAddr;
use std::sync::Arc;

use gdx_engine::{Agent, StatsSnapshot, LATENCY_BOUNDS_S};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::{Encoder, TextEncoder};

use crate::error::{ClusterError, Result};
pub use crate::http::HttpLimits;
use crate::http::{HttpHits, HttpServer, Reply};
use crate::registration::{LeaseState, Shared};

/// What the endpoints report on: an agent and, when it is in a cluster, its registration.
#[derive(Debug, Clone)]
pub struct Health {
    pub(crate) agent: Arc<Agent>,
    pub(crate) reg: Option<Arc<Shared>>,
    pub(crate) disabled: Option<String>,
}

impl Health {
    /// For an agent outside any cluster: healthy while it serves.
    pub fn agent_only(agent: Arc<Agent>) -> Health {
        Health {
            agent,
            reg: None,
            disabled: None,
        }
    }

    /// The registration state; `None` outside a cluster.
    pub fn lease_state(&self) -> Option<LeaseState> {
        match (&self.reg, &self.disabled) {
            (Some(r), _) => Some(r.state()),
            (None, Some(why)) => Some(LeaseState::Disabled {
                reason: why.clone(),
            }),
            (None, None) => None,
        }
    }

    /// `/health`'s verdict: serving, and registered when in a cluster.
    pub fn healthy(&self) -> bool {
        self.agent.listen_addr().is_some() && self.lease_state().is_none_or(|s| s.is_registered())
    }

    /// The `/health` body: one JSON object.
    pub fn body(&self) -> String {
        let lease = match self.lease_state() {
            None => "none (no cluster)".to_string(),
            Some(LeaseState::Registered { lease }) => format!("registered (lease {lease:x})"),
            Some(LeaseState::Lost { reason }) => format!("lost: {reason}"),
            Some(LeaseState::Disabled { reason }) => format!("disabled: {reason}"),
            Some(LeaseState::Left) => "left".to_string(),
        };
        serde_json::json!({
            "status": if self.healthy() { "ok" } else { "unavailable" },
            "agent": self.agent.name(),
            "instance": format!("{:032x}", self.agent.id()),
            "serving": self.agent.listen_addr().map(|a| a.to_string()),
            "lease": lease,
        })
        .to_string()
    }

    /// The `/metrics` body.
    ///
    /// # Errors
    /// [`ClusterError::Metrics`] if encoding fails.
    pub fn metrics_text(&self) -> Result<String> {
        self.metrics_text_with(&HttpHits::default())
    }

    fn metrics_text_with(&self, http: &HttpHits) -> Result<String> {
        let registered = self.lease_state().map(|s| s.is_registered());
        let mut fams = families(&self.agent.stats(), registered);
        fams.extend(guard_families(&self.agent, http));
        let mut buf = Vec::new();
        TextEncoder::new().encode(&fams, &mut buf)?;
        String::from_utf8(buf).map_err(|e| ClusterError::InvalidArgument(e.to_string()))
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name(k.to_string());
            l.set_value(v.to_string());
            l
        })
        .collect()
}

fn family(name: &str, help: &str, t: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(t);
    f.set_metric(metrics);
    f
}

fn counter(pairs: &[(&str, &str)], v: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(v as f64);
    let mut m = Metric::from_label(labels(pairs));
    m.set_counter(c);
    m
}

fn gauge(pairs: &[(&str, &str)], v: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(v);
    let mut m = Metric::from_gauge(g);
    m.set_label(labels(pairs));
    m
}

/// The metric families of one snapshot (families with no sample yet are left out: the text
/// encoder refuses empty ones).
pub fn families(s: &StatsSnapshot, registered: Option<bool>) -> Vec<MetricFamily> {
    let bytes = s
        .paths
        .iter()
        .map(|p| counter(&[("path", &p.path), ("direction", p.direction)], p.bytes))
        .collect();
    let ops = s
        .paths
        .iter()
        .map(|p| counter(&[("path", &p.path), ("direction", p.direction)], p.ops))
        .collect();
    let failures = s
        .failures
        .iter()
        .map(|(r, n)| counter(&[("reason", r)], *n))
        .collect();
    let transfers = vec![
        counter(&[("outcome", "completed")], s.transfers_completed),
        counter(&[("outcome", "failed")], s.transfers_failed),
    ];
    let mut h = Histogram::default();
    let mut cum = 0;
    let mut buckets = Vec::new();
    for (i, bound) in LATENCY_BOUNDS_S.iter().enumerate() {
        cum += s.latency.buckets.get(i).copied().unwrap_or(0);
        let mut b = Bucket::default();
        b.set_cumulative_count(cum);
        b.set_upper_bound(*bound);
        buckets.push(b);
    }
    h.set_bucket(buckets);
    h.set_sample_count(s.latency.count);
    h.set_sample_sum(s.latency.sum_s);
    let mut hm = Metric::default();
    hm.set_histogram(h);
    let peers = vec![
        gauge(&[("direction", "outbound")], s.peers_outbound as f64),
        gauge(&[("direction", "inbound")], s.peers_inbound as f64),
    ];
    let mut v = vec![
        family(
            "gdx_bytes_total",
            "Bytes of completed ops this agent initiated, by path and direction.",
            MetricType::COUNTER,
            bytes,
        ),
        family(
            "gdx_ops_total",
            "Completed ops this agent initiated, by path and direction.",
            MetricType::COUNTER,
            ops,
        ),
        family(
            "gdx_op_failures_total",
            "Failed ops this agent initiated, by reason.",
            MetricType::COUNTER,
            failures,
        ),
        family(
            "gdx_transfers_total",
            "Transfers this agent initiated that ended, by outcome.",
            MetricType::COUNTER,
            transfers,
        ),
        family(
            "gdx_transfer_duration_seconds",
            "Transfer latency, submit to end.",
            MetricType::HISTOGRAM,
            vec![hm],
        ),
        family(
            "gdx_peers_connected",
            "Peers connected now: outbound connections and inbound sessions.",
            MetricType::GAUGE,
            peers,
        ),
    ];
    if let Some(r) = registered {
        v.push(family(
            "gdx_lease_registered",
            "1 while the agent's etcd registration is confirmed, 0 while it is lost.",
            MetricType::GAUGE,
            vec![gauge(&[], if r { 1.0 } else { 0.0 })],
        ));
    }
    v.retain(|f| !f.get_metric().is_empty());
    v
}

/// The families of the agent's guards: limit hits by bound, the endpoint's own refusals, and
/// what peers moved into and out of this agent's regions.
fn guard_families(agent: &Agent, http: &HttpHits) -> Vec<MetricFamily> {
    use std::sync::atomic::Ordering::Relaxed;
    let hits = agent
        .limit_hits()
        .counts()
        .into_iter()
        .map(|(bound, n)| counter(&[("bound", bound)], n))
        .collect();
    let refused = vec![
        counter(&[("why", "evicted")], http.evicted.load(Relaxed)),
        counter(&[("why", "refused")], http.refused.load(Relaxed)),
    ];
    let served = agent.served();
    let bytes = served
        .iter()
        .map(|p| {
            counter(
                &[
                    ("peer", &p.peer),
                    ("path", p.path),
                    ("direction", p.direction),
                ],
                p.bytes,
            )
        })
        .collect();
    let ops = served
        .iter()
        .map(|p| {
            counter(
                &[
                    ("peer", &p.peer),
                    ("path", p.path),
                    ("direction", p.direction),
                ],
                p.ops,
            )
        })
        .collect();
    let (mut rail_bytes, mut rail_errors, mut rail_active) = (Vec::new(), Vec::new(), Vec::new());
    for p in agent.rails() {
        for r in &p.rails {
            let l = [
                ("peer", p.peer.as_str()),
                ("local", r.local.as_str()),
                ("remote", r.remote.as_str()),
            ];
            rail_bytes.push(counter(&l, r.bytes));
            rail_errors.push(counter(&l, r.errors));
            let up = r.state == gdx_engine::RailState::Active;
            rail_active.push(gauge(&l, if up { 1.0 } else { 0.0 }));
        }
    }
    let mut v = vec![
        family(
            "gdx_rail_bytes_total",
            "Bytes this agent moved over each rail of its outbound peer connections.",
            MetricType::COUNTER,
            rail_bytes,
        ),
        family(
            "gdx_rail_errors_total",
            "Errors on each rail of this agent's outbound peer connections (each pauses it).",
            MetricType::COUNTER,
            rail_errors,
        ),
        family(
            "gdx_rail_active",
            "1 while a rail takes work, 0 while it is paused after an error (its cause: \
             Peer::rails(), Python Transfer.rails()).",
            MetricType::GAUGE,
            rail_active,
        ),
        family(
            "gdx_limit_hits_total",
            "Connections and requests refused, closed or evicted by a bound, by bound.",
            MetricType::COUNTER,
            hits,
        ),
        family(
            "gdx_metrics_requests_refused_total",
            "Requests to this endpoint refused (bad method, head too large or too slow) or \
             connections evicted beyond its connection cap.",
            MetricType::COUNTER,
            refused,
        ),
        family(
            "gdx_served_bytes_total",
            "Bytes peers moved into (write) and out of (read) this agent's regions, by peer \
             and path.",
            MetricType::COUNTER,
            bytes,
        ),
        family(
            "gdx_served_ops_total",
            "Op chunks peers ran against this agent's regions, by peer and path.",
            MetricType::COUNTER,
            ops,
        ),
    ];
    v.retain(|f| !f.get_metric().is_empty());
    v
}

/// The HTTP endpoint; dropping it stops the server thread.
pub struct MetricsServer {
    server: HttpServer,
}

impl MetricsServer {
    /// Serves `/metrics` and `/health` for `health` on `addr` (port 0 picks one), with the
    /// default [`HttpLimits`].
    ///
    /// # Errors
    /// [`ClusterError::Io`] if the address cannot be bound.
    pub fn start(addr: SocketAddr, health: Health) -> Result<MetricsServer> {
        MetricsServer::start_with(addr, health, HttpLimits::default())
    }

    /// [`MetricsServer::start`] with chosen bounds.
    ///
    /// # Errors
    /// [`ClusterError::Io`] if the address cannot be bound.
    pub fn start_with(
        addr: SocketAddr,
        health: Health,
        limits: HttpLimits,
    ) -> Result<MetricsServer> {
        let hits = Arc::new(HttpHits::default());
        let h = Arc::clone(&hits);
        let server = HttpServer::start(addr, limits, hits, move |path| respond(path, &health, &h))?;
        Ok(MetricsServer { server })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }
}

fn respond(path: &str, health: &Health, hits: &HttpHits) -> Reply {
    match path {
        "/metrics" => match health.metrics_text_with(hits) {
            Ok(t) => (200, "text/plain; version=0.0.4; charset=utf-8", t),
            Err(e) => (500, "text/plain; charset=utf-8", e.to_string()),
        },
        "/health" => (
            if health.healthy() { 200 } else { 503 },
            "application/json",
            health.body(),
        ),
        _ => (
            404,
            "text/plain; charset=utf-8",
            "not found: try /metrics or /health\n".to_string(),
        ),
    }
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdx_engine::{LatencyStat, PathStat};

    #[test]
    fn text_format_carries_every_counter() {
        let mut buckets = vec![0; LATENCY_BOUNDS_S.len() + 1];
        buckets[3] = 2;
        let s = StatsSnapshot {
            paths: vec![PathStat {
                path: "shm".into(),
                direction: "write",
                bytes: 12345,
                ops: 3,
            }],
            failures: vec![("peer_lost".into(), 1)],
            transfers_completed: 2,
            transfers_failed: 1,
            latency: LatencyStat {
                buckets,
                sum_s: 0.002,
                count: 2,
            },
            peers_outbound: 1,
            peers_inbound: 0,
        };
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&families(&s, Some(false)), &mut buf)
            .expect("encode");
        let t = String::from_utf8(buf).expect("utf8");
        for want in [
            "gdx_bytes_total{path=\"shm\",direction=\"write\"} 12345",
            "gdx_ops_total{path=\"shm\",direction=\"write\"} 3",
            "gdx_op_failures_total{reason=\"peer_lost\"} 1",
            "gdx_transfers_total{outcome=\"failed\"} 1",
            "gdx_transfer_duration_seconds_bucket{le=\"0.001\"} 2",
            "gdx_transfer_duration_seconds_count 2",
            "gdx_peers_connected{direction=\"outbound\"} 1",
            "gdx_lease_registered 0",
        ] {
            assert!(t.contains(want), "{want:?} missing from\n{t}");
        }
    }
}
