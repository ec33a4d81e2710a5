//! The acceptor's handshakes: the control connection's SPAKE2 exchange under the agent secret
//! (creating the session and its identity tag), and a joining connection's proof of the session
//! key (making it a member the session's end shuts down).

use std::sync::Arc;

use crate::agent_state::AgentInner;
use crate::auth;
use crate::conn::Conn;
use crate::error::{AuthFailure, Error, Result};
use crate::region::RegionKey;
use crate::session::Session;
use crate::session::{identity_tag, Member};
use crate::wire::Hello;

pub(super) fn check_name(agent: &AgentInner, what: &str, name: &str) -> Result<()> {
    let max = agent.cfg.limits.max_name_bytes;
    if name.len() > max {
        let what = format!("{what} of {} bytes > max_name_bytes", name.len());
        agent.hits.hit(&agent.hits.names, &what);
        return Err(Error::LimitReached {
            what,
            limit: max as u64,
        });
    }
    Ok(())
}

/// The acceptor's side of the control handshake: the SPAKE2 exchange under the agent secret
/// (none in insecure mode), then a session that joining connections must match.
/// Returns the session id, its token (the identity tag; insecure mode: a random token) and the
/// cluster the tag covers (read once, so the reply names the cluster its tag proves).
pub(super) fn control_handshake(
    agent: &AgentInner,
    c: &mut Conn,
    h: &Hello,
) -> Result<(u128, u128, String)> {
    check_name(agent, "agent name", &h.agent_name)?;
    check_name(agent, "cluster name", &h.cluster)?;
    let session = crate::mem::random_u128()?;
    let cluster = agent
        .cluster
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (token, key) = match &agent.secret {
        Some(secret) => {
            let ctx = h.agent_id.to_le_bytes();
            let key = auth::accept_control(c, secret, &ctx, h.nonce)?;
            // Authenticated mode: the token carries this agent's identity tag, its own key
            // confirmation (joins prove the session key instead of presenting a token).
            let tag = identity_tag(&key, &agent.cfg.name, &cluster, agent.id, session);
            (tag, Some(key))
        }
        None => (crate::mem::random_u128()?, None),
    };
    agent
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            session,
            Session {
                token,
                key,
                peer: h.agent_name.clone(),
                members: Arc::default(),
            },
        );
    Ok((session, token, cluster))
}

/// The acceptor's side of a joining connection (data stream, shm socket): it must prove it
/// holds the session's key (or, insecure, present its token).
pub(super) fn join_handshake(
    agent: &AgentInner,
    c: &mut Conn,
    session: u128,
    token: u128,
    ctx: &[u8],
    nonce: u128,
    what: &str,
) -> Result<(Session, Member)> {
    let s = agent
        .session(session)
        .ok_or_else(|| Error::auth(AuthFailure::Session, format!("{what}: unknown session")))?;
    match &s.key {
        Some(k) => {
            auth::accept(c, k, what, ctx, nonce)?;
        }
        None => {
            if !RegionKey(s.token).ct_eq(&RegionKey(token)) {
                return Err(Error::auth(
                    AuthFailure::Session,
                    format!("{what}: bad session token"),
                ));
            }
        }
    }
    // Fails when the session ended during the join's handshake.
    let member = s.members.join(c.shutdown_handle()?)?;
    Ok((s, member))
}
