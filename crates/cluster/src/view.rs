//! [`ClusterView`]: the read side of a cluster — list its agents, look one up, watch joins
//! and leaves. Used by `gdx peers` and by [`crate::ClusterAgent`] to drop peers whose lease
//! ended.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};

use crate::error::{ClusterError, Result};
use crate::etcd::{Etcd, EtcdOptions};
use crate::record::{decode, AgentRecord, Keys, RegionRecord};

/// One agent of a cluster with its regions and lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AgentListing {
    /// What the agent published.
    pub agent: AgentRecord,
    /// Its regions (keyless), by name.
    pub regions: Vec<RegionRecord>,
    /// Seconds left on its lease when read (-1 if the lease is already gone).
    pub ttl_left_s: i64,
    /// The etcd lease id.
    pub lease: i64,
}

/// A change in a cluster's membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEvent {
    /// An agent registered (or re-registered; `agent.instance` says whether it is a new start).
    Joined(AgentRecord),
    /// An agent's key went away: its lease expired or was revoked.
    Left {
        /// The agent name.
        name: String,
        /// The instance that left, when known from the watch.
        instance: Option<String>,
    },
    /// The watch lost etcd; it keeps retrying with backoff (the event repeats at most once per
    /// outage).
    EtcdLost(String),
    /// The watch is back after [`AgentEvent::EtcdLost`].
    EtcdBack,
}

/// A read-only connection to one cluster.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub(crate) etcd: Etcd,
    pub(crate) keys: Keys,
    pub(crate) cluster: String,
}

impl ClusterView {
    /// Connects to etcd for cluster `cluster`.
    ///
    /// # Errors
    /// [`ClusterError::Unreachable`] if etcd does not answer; [`ClusterError::InvalidArgument`]
    /// for a bad cluster name.
    pub fn connect(opts: &EtcdOptions, cluster: &str) -> Result<ClusterView> {
        let keys = Keys::new(cluster)?;
        Ok(ClusterView {
            etcd: Etcd::connect(opts)?,
            keys,
            cluster: cluster.to_string(),
        })
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The agent registered under `name`.
    ///
    /// # Errors
    /// [`ClusterError::NoSuchAgent`] if none is; [`ClusterError::Unreachable`].
    pub fn lookup(&self, name: &str) -> Result<AgentRecord> {
        let key = self.keys.agent(name);
        let mut c = self.etcd.client.clone();
        let r = self
            .etcd
            .block_on(c.get(key.clone(), None))
            .map_err(|e| self.etcd.err("looking up an agent", e))?;
        match r.kvs().first() {
            Some(kv) => decode(kv.key(), kv.value()),
            None => Err(ClusterError::NoSuchAgent {
                cluster: self.cluster.clone(),
                name: name.to_string(),
            }),
        }
    }

    /// Every agent of the cluster, sorted by name, with regions and lease time left.
    ///
    /// # Errors
    /// [`ClusterError::Unreachable`]; [`ClusterError::Malformed`] for a record gdx did not write.
    pub fn agents(&self) -> Result<Vec<AgentListing>> {
        let mut c = self.etcd.client.clone();
        let etcd = &self.etcd;
        let (agents, regions) = etcd
            .block_on(async {
                let a = c
                    .get(self.keys.agents(), Some(GetOptions::new().with_prefix()))
                    .await?;
                let r = c
                    .get(
                        format!("/gdx/{}/regions/", self.cluster),
                        Some(GetOptions::new().with_prefix()),
                    )
                    .await?;
                Ok::<_, etcd_client::Error>((a, r))
            })
            .map_err(|e| etcd.err("reading the cluster", e))?;
        let mut by_agent: HashMap<String, Vec<RegionRecord>> = HashMap::new();
        for kv in regions.kvs() {
            let rec: RegionRecord = decode(kv.key(), kv.value())?;
            let k = String::from_utf8_lossy(kv.key()).into_owned();
            let agent = k
                .strip_prefix(&format!("/gdx/{}/regions/", self.cluster))
                .and_then(|s| s.split('/').next())
                .unwrap_or_default()
                .to_string();
            by_agent.entry(agent).or_default().push(rec);
        }
        let mut out = Vec::new();
        for kv in agents.kvs() {
            let agent: AgentRecord = decode(kv.key(), kv.value())?;
            let lease = kv.lease();
            let ttl_left_s = etcd
                .block_on(c.lease_time_to_live(lease, None))
                .map(|r| r.ttl())
                .unwrap_or(-1);
            let mut regions = by_agent.remove(&agent.name).unwrap_or_default();
            regions.sort_by(|a, b| a.name.cmp(&b.name));
            out.push(AgentListing {
                agent,
                regions,
                ttl_left_s,
                lease,
            });
        }
        out.sort_by(|a, b| a.agent.name.cmp(&b.agent.name));
        Ok(out)
    }

    /// Watches joins and leaves from now on. The watch survives etcd outages: it reconnects
    /// with backoff (0.2 s doubling to 5 s) and resumes at the revision after the last event
    /// seen, so a leave during the outage is still reported. Ends when the receiver drops.
    pub fn watch(&self) -> Receiver<AgentEvent> {
        let (tx, rx) = channel();
        // The task holds the client, not the runtime: dropping the last view then stops it.
        let client = self.etcd.client.clone();
        let keys = self.keys.clone();
        self.etcd.rt.spawn(watch_loop(client, keys, tx));
        rx
    }
}

async fn watch_loop(client: etcd_client::Client, keys: Keys, tx: Sender<AgentEvent>) {
    let mut next_rev: i64 = 0;
    let mut backoff = Duration::from_millis(200);
    let mut lost = false;
    // Instance per agent name, so a Left event can say which instance left.
    let mut known: HashMap<String, String> = HashMap::new();
    loop {
        let mut c = client.clone();
        // prev_kv: a delete then says which instance left, even one that joined before the watch.
        let mut opts = WatchOptions::new().with_prefix().with_prev_key();
        if next_rev > 0 {
            opts = opts.with_start_revision(next_rev);
        }
        let res = c.watch(keys.agents(), Some(opts)).await;
        let why = match res {
            Ok((_watcher, mut stream)) => loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if lost {
                            lost = false;
                            if tx.send(AgentEvent::EtcdBack).is_err() {
                                return;
                            }
                        }
                        backoff = Duration::from_millis(200);
                        if let Some(h) = resp.header() {
                            next_rev = next_rev.max(h.revision() + 1);
                        }
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            next_rev = next_rev.max(kv.mod_revision() + 1);
                            let Some(name) = keys.agent_of(kv.key()) else {
                                continue;
                            };
                            let e = match ev.event_type() {
                                EventType::Put => match decode::<AgentRecord>(kv.key(), kv.value())
                                {
                                    Ok(rec) => {
                                        known.insert(name, rec.instance.clone());
                                        AgentEvent::Joined(rec)
                                    }
                                    Err(e) => {
                                        log::warn!("gdx cluster watch: {e}");
                                        continue;
                                    }
                                },
                                EventType::Delete => {
                                    let prev = ev.prev_kv().and_then(|p| {
                                        decode::<AgentRecord>(p.key(), p.value()).ok()
                                    });
                                    let known = known.remove(&name);
                                    AgentEvent::Left {
                                        instance: prev.map(|r| r.instance).or(known),
                                        name,
                                    }
                                }
                            };
                            if tx.send(e).is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => break "watch stream ended".to_string(),
                    Err(e) => break e.to_string(),
                }
            },
            Err(e) => e.to_string(),
        };
        if !lost {
            lost = true;
            log::warn!("gdx cluster watch: etcd lost ({why}); retrying with backoff");
            if tx.send(AgentEvent::EtcdLost(why)).is_err() {
                return;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
