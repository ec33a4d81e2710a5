//! Whom a connect reached: the acceptor's identity tag is checked against the session key (so
//! the name and instance id in its `Hello` reply are the authenticated agent's own), and
//! compared with the agent the caller asked for (a redirected etcd record, a stale address
//! book): a mismatch fails the connect before any stream joins, naming the agent reached.

use std::net::SocketAddr;

use crate::auth::Mac;
use crate::error::{AuthFailure, Error, Result};
use crate::session::identity_tag;
use crate::wire::Hello;

/// The agent a connect must reach ([`crate::Agent::connect_expecting`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Expected {
    /// Its agent name.
    pub name: String,
    /// Its instance (agent id), when known (etcd lists it); `None`: any instance of `name`.
    pub agent_id: Option<u128>,
    /// Its cluster ([`crate::Agent::set_cluster`]), when the caller asked within one; `None`:
    /// any. The acceptor's identity tag covers it, so an etcd record of cluster `c1` rewritten
    /// to point at a namesake in `c2` (same secret) is refused.
    pub cluster: Option<String>,
}

/// Checks the acceptor's reply `h`: its identity tag under the session `key` (authenticated
/// mode), then the expected name and instance.
pub(super) fn check(
    h: &Hello,
    key: Option<&Mac>,
    expect: Option<&Expected>,
    addr: SocketAddr,
) -> Result<()> {
    if let Some(k) = key {
        if identity_tag(k, &h.agent_name, &h.cluster, h.agent_id, h.session) != h.token {
            return Err(Error::auth(
                AuthFailure::Proof,
                format!(
                    "the peer at {addr} did not prove the secret: its identity tag (agent {}, \
                 instance {:032x}) does not match the session key, so it holds a different \
                 secret (check GDX_SECRET_FILE / --secret-file on both sides) or the reply was \
                 altered on the way",
                    gdx_topo::printable(&h.agent_name),
                    h.agent_id
                ),
            ));
        }
    }
    let Some(e) = expect else { return Ok(()) };
    let name_ok = e.name == h.agent_name;
    let id_ok = e.agent_id.is_none_or(|id| id == h.agent_id);
    let cluster_ok = e.cluster.as_ref().is_none_or(|c| *c == h.cluster);
    if name_ok && id_ok && cluster_ok {
        return Ok(());
    }
    let mut wanted = format!("agent {:?}", gdx_topo::printable(&e.name));
    if let Some(id) = e.agent_id {
        wanted.push_str(&format!(" instance {id:032x}"));
    }
    if let Some(c) = &e.cluster {
        wanted.push_str(&format!(" of cluster {:?}", gdx_topo::printable(c)));
    }
    Err(Error::auth(
        AuthFailure::WrongAgent,
        format!(
            "reached agent {:?} instance {:032x} of {} at {addr}, not {wanted}: the address (an \
         etcd record, a peer list) points at another agent; refusing it",
            gdx_topo::printable(&h.agent_name),
            h.agent_id,
            cluster_words(&h.cluster),
        ),
    ))
}

fn cluster_words(c: &str) -> String {
    if c.is_empty() {
        "no cluster".into()
    } else {
        format!("cluster {:?}", gdx_topo::printable(c))
    }
}
