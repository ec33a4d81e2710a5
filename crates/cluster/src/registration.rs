//! An agent's registration: its records in etcd on one lease, the keep-alive loop, and
//! re-registration (with backoff) after etcd comes back or the lease is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::watch;

use crate::error::{ClusterError, Result};
use crate::etcd::{is_unreachable, Etcd};
use crate::record::{decode, encode, AgentRecord, Keys, RegionRecord};

/// Where an agent's registration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Registered on this etcd lease, kept alive.
    Registered {
        /// The lease id.
        lease: i64,
    },
    /// The registration is gone or unconfirmed (etcd unreachable, lease expired); the agent
    /// keeps serving its connected peers and re-registers with backoff.
    Lost {
        /// Why ("etcd unreachable: ...", "lease expired", "name taken by ...").
        reason: String,
    },
    /// No registration: `--etcd-optional` and etcd was unreachable at start, or no etcd given.
    Disabled {
        /// Why.
        reason: String,
    },
    /// Revoked on clean shutdown.
    Left,
}

impl LeaseState {
    /// True while registered.
    pub fn is_registered(&self) -> bool {
        matches!(self, LeaseState::Registered { .. })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) agent: AgentRecord,
    pub(crate) regions: Vec<RegionRecord>,
}

/// The registration's state, shared with its keep-alive task and with [`crate::metrics::Health`].
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<LeaseState>,
    pub(crate) published: Mutex<Published>,
}

impl Shared {
    pub(crate) fn state(&self) -> LeaseState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, s: LeaseState) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn published(&self) -> Published {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The live registration; dropping it revokes the lease.
#[derive(Debug)]
pub(crate) struct Registration {
    etcd: Etcd,
    keys: Keys,
    pub(crate) shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

fn put_opts(lease: i64) -> Option<PutOptions> {
    Some(PutOptions::new().with_lease(lease))
}

fn record_ops(keys: &Keys, p: &Published, lease: i64) -> Result<Vec<TxnOp>> {
    let mut ops = vec![TxnOp::put(
        keys.agent(&p.agent.name),
        encode(&p.agent)?,
        put_opts(lease),
    )];
    for r in &p.regions {
        ops.push(TxnOp::put(
            keys.region(&p.agent.name, &r.name),
            encode(r)?,
            put_opts(lease),
        ));
    }
    Ok(ops)
}

fn etcd_err(endpoints: &str, what: &'static str, source: etcd_client::Error) -> ClusterError {
    if is_unreachable(&source) {
        ClusterError::Unreachable {
            endpoints: endpoints.to_string(),
            what,
            source,
        }
    } else {
        ClusterError::Etcd { what, source }
    }
}

/// Grants a lease and takes the name with a create-if-absent transaction, writing the agent
/// and region records on that lease in the same transaction.
async fn register_once(
    c: &mut Client,
    keys: &Keys,
    cluster: &str,
    p: &Published,
    ttl: i64,
    endpoints: &str,
) -> Result<i64> {
    let lease = c
        .lease_grant(ttl, None)
        .await
        .map_err(|e| etcd_err(endpoints, "granting a lease", e))?
        .id();
    let akey = keys.agent(&p.agent.name);
    let ops = record_ops(keys, p, lease)?;
    let txn = Txn::new()
        .when([Compare::create_revision(akey.clone(), CompareOp::Equal, 0)])
        .and_then(ops.clone())
        .or_else([TxnOp::get(akey.clone(), None)]);
    let resp = c
        .txn(txn)
        .await
        .map_err(|e| etcd_err(endpoints, "taking the agent name", e))?;
    if resp.succeeded() {
        return Ok(lease);
    }
    let holder = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .map(|kv| decode::<AgentRecord>(kv.key(), kv.value())),
        _ => None,
    });
    match holder {
        Some(Ok(h)) if h.instance == p.agent.instance => {
            // Our own records on an older lease that outlived an outage: move them to the new
            // lease (the name is ours, no race with another agent).
            let txn = Txn::new().and_then(ops);
            c.txn(txn)
                .await
                .map_err(|e| etcd_err(endpoints, "re-publishing on a new lease", e))?;
            Ok(lease)
        }
        holder => {
            let _ = c.lease_revoke(lease).await;
            match holder {
                Some(Ok(h)) => Err(ClusterError::NameTaken {
                    cluster: cluster.to_string(),
                    name: p.agent.name.clone(),
                    holder_instance: h.instance,
                    holder_listen: h.listen,
                    holder_pid: h.pid,
                }),
                Some(Err(e)) => Err(e),
                // Deleted between the compare and the get: the next attempt takes it.
                None => Err(ClusterError::InvalidArgument(format!(
                    "agent name {:?} changed hands during registration; retry",
                    p.agent.name
                ))),
            }
        }
    }
}

/// Keeps `lease` alive until it is lost; returns why.
async fn keep(c: &mut Client, lease: i64, ttl: i64) -> String {
    let (mut keeper, mut stream) = match c.lease_keep_alive(lease).await {
        Ok(x) => x,
        Err(e) => return format!("etcd unreachable: {e}"),
    };
    // Three renewals per TTL: one lost answer still leaves time for the next.
    let period = Duration::from_millis((ttl.max(1) as u64 * 1000 / 3).max(200));
    loop {
        if let Err(e) = keeper.keep_alive().await {
            return format!("etcd unreachable: {e}");
        }
        match tokio::time::timeout(period, stream.message()).await {
            Ok(Ok(Some(r))) if r.ttl() > 0 => {}
            Ok(Ok(Some(_))) => return "lease expired".into(),
            Ok(Ok(None)) => return "etcd unreachable: keep-alive stream ended".into(),
            Ok(Err(e)) => return format!("etcd unreachable: {e}"),
            Err(_) => return format!("etcd unreachable: no keep-alive answer within {period:?}"),
        }
        tokio::time::sleep(period).await;
    }
}

struct Maintain {
    client: Client,
    keys: Keys,
    cluster: String,
    endpoints: String,
    shared: Arc<Shared>,
    ttl: i64,
}

impl Maintain {
    async fn run(mut self, mut lease: i64, mut stop: watch::Receiver<bool>) {
        let name = self.shared.published().agent.name;
        loop {
            let reason = tokio::select! {
                r = keep(&mut self.client, lease, self.ttl) => r,
                _ = stop.changed() => return,
            };
            self.shared.set(LeaseState::Lost {
                reason: reason.clone(),
            });
            log::warn!("gdx cluster: agent {name}: registration lost ({reason}); re-registering");
            let mut backoff = Duration::from_millis(500);
            let mut last_err = String::new();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                // The lease may have outlived the outage (etcd extends leases when it restarts).
                if let Ok(r) = self.client.lease_time_to_live(lease, None).await {
                    if r.ttl() > 0 {
                        self.shared.set(LeaseState::Registered { lease });
                        log::warn!("gdx cluster: agent {name}: etcd is back; lease {lease:x} kept");
                        break;
                    }
                }
                let p = self.shared.published();
                let r = register_once(
                    &mut self.client,
                    &self.keys,
                    &self.cluster,
                    &p,
                    self.ttl,
                    &self.endpoints,
                )
                .await;
                match r {
                    Ok(l) => {
                        lease = l;
                        self.shared.set(LeaseState::Registered { lease });
                        log::warn!("gdx cluster: agent {name}: re-registered (lease {lease:x})");
                        break;
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        if msg != last_err {
                            log::warn!("gdx cluster: agent {name}: re-registration failed: {msg}");
                        }
                        self.shared.set(LeaseState::Lost {
                            reason: msg.clone(),
                        });
                        last_err = msg;
                    }
                }
            }
        }
    }
}

impl Registration {
    /// Registers `p` on a fresh lease of `ttl` seconds and starts keeping it alive.
    pub(crate) fn start(
        etcd: &Etcd,
        keys: &Keys,
        cluster: &str,
        p: Published,
        ttl: i64,
    ) -> Result<Registration> {
        let mut c = etcd.client.clone();
        let lease = etcd.block_on(register_once(
            &mut c,
            keys,
            cluster,
            &p,
            ttl,
            &etcd.endpoints,
        ))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(LeaseState::Registered { lease }),
            published: Mutex::new(p),
        });
        let (stop, stop_rx) = watch::channel(false);
        let m = Maintain {
            client: c,
            keys: keys.clone(),
            cluster: cluster.to_string(),
            endpoints: etcd.endpoints.clone(),
            shared: Arc::clone(&shared),
            ttl,
        };
        etcd.rt.spawn(m.run(lease, stop_rx));
        Ok(Registration {
            etcd: etcd.clone(),
            keys: keys.clone(),
            shared,
            stop,
        })
    }

    /// Replaces the published region records (puts new ones, deletes gone ones) on the
    /// current lease; while unregistered, only remembers them for re-registration.
    pub(crate) fn set_regions(&self, regions: Vec<RegionRecord>) -> Result<()> {
        let old = {
            let mut p = self
                .shared
                .published
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut p.regions, regions)
        };
        let LeaseState::Registered { lease } = self.shared.state() else {
            return Ok(());
        };
        let p = self.shared.published();
        let mut ops = record_ops(&self.keys, &p, lease)?;
        for r in old
            .iter()
            .filter(|o| !p.regions.iter().any(|n| n.name == o.name))
        {
            ops.push(TxnOp::delete(
                self.keys.region(&p.agent.name, &r.name),
                None,
            ));
        }
        let mut c = self.etcd.client.clone();
        self.etcd
            .block_on(c.txn(Txn::new().and_then(ops)))
            .map_err(|e| self.etcd.err("publishing regions", e))?;
        Ok(())
    }

    /// Stops the keep-alive and revokes the lease, so the agent's keys go at once.
    pub(crate) fn leave(&self) -> Result<()> {
        let _ = self.stop.send(true);
        let state = self.shared.state();
        self.shared.set(LeaseState::Left);
        if let LeaseState::Registered { lease } = state {
            let mut c = self.etcd.client.clone();
            let t = self.etcd.timeout;
            self.etcd
                .block_on(async { tokio::time::timeout(t, c.lease_revoke(lease)).await })
                .map_err(|_| ClusterError::Unreachable {
                    endpoints: self.etcd.endpoints.clone(),
                    what: "revoking the lease",
                    source: etcd_client::Error::InvalidArgs("timed out".into()),
                })?
                .map_err(|e| self.etcd.err("revoking the lease", e))?;
        }
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.shared.state() != LeaseState::Left {
            if let Err(e) = self.leave() {
                log::warn!("gdx cluster: {e}; the lease expires by itself within its TTL");
            }
        }
    }
}
