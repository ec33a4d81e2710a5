//! What gdx writes into etcd: one [`AgentRecord`] per agent and one [`RegionRecord`] per
//! published region, as JSON, under `/gdx/<cluster>/agents/<agent>` and
//! `/gdx/<cluster>/regions/<agent>/<region>`.
//!
//! A [`RegionRecord`] is a RegionDesc with its key and CUDA IPC handle removed: read access to
//! etcd must not be write access to GPU memory, so a peer fetches the keyed descriptor over its
//! authenticated session ([`gdx_engine::Peer::region`]).

use gdx_engine::{Access, Location, RegionDesc};
use serde::{Deserialize, Serialize};

use crate::error::{ClusterError, Result};

/// An agent as etcd lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Agent name (unique in the cluster while its lease lives).
    pub name: String,
    /// Instance id: the engine's random agent id of this start (32 hex digits). A restarted
    /// agent has a new one, and [`crate::ClusterAgent::connect_named`] refuses a peer whose
    /// handshake names another.
    pub instance: String,
    /// Host id (kernel boot id unless overridden), 32 hex digits.
    pub host_id: String,
    /// The host's name (kernel hostname), for people reading `gdx peers`.
    pub hostname: String,
    /// Where the agent accepts peers (`IP:PORT`).
    pub listen: String,
    /// Transports it offers (`tcp`, `shm`, `rdma`).
    pub transports: Vec<String>,
    /// GPUs of its host, as the caller described them (may be empty).
    pub gpus: Vec<String>,
    /// RDMA NICs of its host, as the caller described them (may be empty).
    pub nics: Vec<String>,
    /// Process id (to name the holder in a name collision).
    pub pid: u32,
    /// Lease TTL asked for, in seconds.
    pub ttl_s: i64,
}

/// A published region without its key: enough to list and to plan, not to access.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRecord {
    /// Name it is published under.
    pub name: String,
    /// Region id inside its agent.
    pub id: u64,
    /// Length in bytes.
    pub len: u64,
    /// Where the bytes live.
    pub location: Location,
    /// What peers may do with it.
    pub access: Access,
    /// Whether a same-host peer can map it.
    pub shareable: bool,
}

impl RegionRecord {
    /// The keyless form of `d` (None for an unnamed region, which is not published).
    pub fn from_desc(d: &RegionDesc) -> Option<RegionRecord> {
        Some(RegionRecord {
            name: d.name.clone()?,
            id: d.id,
            len: d.len,
            location: d.location,
            access: d.access,
            shareable: d.shareable,
        })
    }
}

/// etcd key layout of one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    root: String,
}

/// Names travel inside keys, so a '/' would let one agent write into another's subtree.
pub(crate) fn check_name(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.contains('/') || s.chars().any(char::is_control) {
        return Err(ClusterError::InvalidArgument(format!(
            "{what} {s:?} must be non-empty, without '/' or control characters"
        )));
    }
    Ok(())
}

impl Keys {
    pub(crate) fn new(cluster: &str) -> Result<Keys> {
        check_name("cluster name", cluster)?;
        Ok(Keys {
            root: format!("/gdx/{cluster}/"),
        })
    }

    pub(crate) fn agents(&self) -> String {
        format!("{}agents/", self.root)
    }

    pub(crate) fn agent(&self, name: &str) -> String {
        format!("{}agents/{name}", self.root)
    }

    pub(crate) fn region(&self, agent: &str, region: &str) -> String {
        format!("{}regions/{agent}/{region}", self.root)
    }

    /// The agent name in an agent key, if `key` is one.
    pub(crate) fn agent_of(&self, key: &[u8]) -> Option<String> {
        let k = std::str::from_utf8(key).ok()?;
        k.strip_prefix(&self.agents()).map(str::to_string)
    }
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(key: &[u8], value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| ClusterError::Malformed {
        key: String::from_utf8_lossy(key).into_owned(),
        message: e.to_string(),
    })
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| ClusterError::InvalidArgument(format!("encoding: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdx_engine::RegionKey;

    #[test]
    fn names_with_slashes_are_refused() {
        for bad in ["", "a/b", "../x", "a\nb"] {
            assert!(check_name("agent name", bad).is_err(), "{bad:?}");
        }
        assert!(check_name("agent name", "prefill-3").is_ok());
        assert!(Keys::new("a/b").is_err());
    }

    #[test]
    fn key_layout() {
        let k = Keys::new("c").expect("keys");
        assert_eq!(k.agent("x"), "/gdx/c/agents/x");
        assert_eq!(k.region("x", "kv"), "/gdx/c/regions/x/kv");
        assert_eq!(k.agent_of(b"/gdx/c/agents/x").as_deref(), Some("x"));
        assert_eq!(k.agent_of(b"/gdx/other/agents/x"), None);
    }

    #[test]
    fn region_record_drops_the_key() {
        let d = RegionDesc {
            id: 7,
            key: RegionKey(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
            len: 4096,
            location: Location::Host,
            access: Access::READ_WRITE,
            shareable: true,
            name: Some("kv".into()),
            ipc: None,
            no_ipc: None,
        };
        let r = RegionRecord::from_desc(&d).expect("named");
        let json = String::from_utf8(encode(&r).expect("encode")).expect("utf8");
        assert!(
            !json.contains("key") && !json.contains("0123456789abcdef"),
            "{json}"
        );
        assert_eq!((r.id, r.len, r.name.as_str()), (7, 4096, "kv"));
        let unnamed = RegionDesc { name: None, ..d };
        assert!(RegionRecord::from_desc(&unnamed).is_none());
    }
}
