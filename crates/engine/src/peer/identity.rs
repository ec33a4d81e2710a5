//! Whom a connect reached: the acceptor's identity tag is checked against the session key (so
//! the name and instance id in its `Hello` reply are the authenticated agent's own), and
//! compared with the agent the caller asked for (a redirected etcd record, a stale address
//! book): a mismatch fails the connect before any stream joins, naming the agent reached.

use std::net::SocketAddr;

use crate::auth::Mac;
use crate::error::{Error, Result};
use crate::session::identity_tag;
use crate::wire::Hello;

/// The agent a connect must reach ([`crate::Agent::connect_expecting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Its agent name.
    pub name: String,
    /// Its instance (agent id), when known (etcd lists it); `None`: any instance of `name`.
    pub agent_id: Option<u128>,
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
        if identity_tag(k, &h.agent_name, h.agent_id, h.session) != h.token {
            return Err(Error::AuthFailed(format!(
                "the peer at {addr} authenticated, but its identity (agent {}, instance \
                 {:032x}) is not bound to the session: the reply was altered on the way, or the \
                 peer runs an older gdx",
                gdx_topo::printable(&h.agent_name),
                h.agent_id
            )));
        }
    }
    let Some(e) = expect else { return Ok(()) };
    let name_ok = e.name == h.agent_name;
    let id_ok = e.agent_id.is_none_or(|id| id == h.agent_id);
    if name_ok && id_ok {
        return Ok(());
    }
    let wanted = match e.agent_id {
        Some(id) => format!(
            "agent {:?} instance {id:032x}",
            gdx_topo::printable(&e.name)
        ),
        None => format!("agent {:?}", gdx_topo::printable(&e.name)),
    };
    Err(Error::AuthFailed(format!(
        "reached agent {:?} instance {:032x} at {addr}, not {wanted}: the address (an etcd \
         record, a peer list) points at another agent; refusing it",
        gdx_topo::printable(&h.agent_name),
        h.agent_id
    )))
}
