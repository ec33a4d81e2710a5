//! An inbound control session and what it owns: the data streams and shm connections that
//! joined it. Ending the control connection (Bye, close, idle timeout, an error) ends the
//! session, and that shuts every joined connection down, so a peer's access ends with its
//! session: no ring request or stream read is served after it.
//!
//! Also the acceptor's identity tag: its name, instance id and session id under the session
//! key, sent in the `Hello` reply's `token` field (authenticated mode), so the initiator can
//! check it reached the agent it asked for and that no one rewrote the reply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::auth::{mac, Mac};
use crate::conn::Sock;
use crate::error::{Error, Result};

/// An authenticated control session, as joining connections must match it.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// Insecure mode: the token joining connections present.
    pub(crate) token: u128,
    /// The session key joining connections prove they hold (`None` in insecure mode).
    pub(crate) key: Option<Mac>,
    /// The peer agent's name.
    pub(crate) peer: String,
    /// The connections that joined the session.
    pub(crate) members: Arc<Members>,
}

/// The joined connections of one session: `None` once the session ended.
#[derive(Debug)]
pub(crate) struct Members {
    socks: Mutex<Option<(u64, HashMap<u64, Sock>)>>,
}

impl Default for Members {
    fn default() -> Self {
        Members {
            socks: Mutex::new(Some((0, HashMap::new()))),
        }
    }
}

/// A joined connection's membership; leaving (drop) forgets its socket handle.
#[derive(Debug)]
pub(crate) struct Member {
    members: Arc<Members>,
    id: u64,
}

impl Members {
    /// Adds a joined connection (`sock`: a handle to shut it down with).
    ///
    /// # Errors
    /// [`Error::PeerLost`] when the session ended meanwhile: the join is refused.
    pub(crate) fn join(self: &Arc<Self>, sock: Sock) -> Result<Member> {
        let mut g = self.socks.lock().unwrap_or_else(|p| p.into_inner());
        let Some((next, m)) = g.as_mut() else {
            return Err(Error::peer_lost(
                "join: the control session ended; connect again",
            ));
        };
        *next += 1;
        m.insert(*next, sock);
        Ok(Member {
            members: Arc::clone(self),
            id: *next,
        })
    }

    /// Ends the session: every joined connection is shut down (its serving thread wakes with
    /// an error and stops), and later joins are refused. Returns how many were shut down.
    pub(crate) fn end(&self) -> usize {
        let taken = self.socks.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((_, m)) = taken else { return 0 };
        for s in m.values() {
            s.shutdown();
        }
        m.len()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut g = self.members.socks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, m)) = g.as_mut() {
            m.remove(&self.id);
        }
    }
}

/// The acceptor's identity tag: its name, cluster and instance id bound to the session under
/// the session key (the first 16 bytes of the MAC). It is also the acceptor's SPAKE2 key
/// confirmation: only a holder of the secret can compute the session key.
pub(crate) fn identity_tag(
    key: &Mac,
    name: &str,
    cluster: &str,
    agent_id: u128,
    session: u128,
) -> u128 {
    let m = mac(
        key,
        "gdx/7 acceptor identity",
        &[
            &(name.len() as u64).to_le_bytes(),
            name.as_bytes(),
            &(cluster.len() as u64).to_le_bytes(),
            cluster.as_bytes(),
            &agent_id.to_le_bytes(),
            &session.to_le_bytes(),
        ],
    );
    let mut b = [0u8; 16];
    b.copy_from_slice(&m[..16]);
    u128::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_a_session_refuses_later_joins_and_forgets_left_members() {
        let m = Arc::new(Members::default());
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let member = m.join(Sock::Unix(a)).unwrap_or_else(|e| panic!("{e}"));
        drop(member);
        assert_eq!(m.end(), 0, "a member that left is not shut down again");
        let (c, _d) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        assert!(m.join(Sock::Unix(c)).is_err(), "joined an ended session");
    }

    #[test]
    fn the_identity_tag_binds_name_cluster_instance_and_session() {
        let k = [7u8; 32];
        let t = identity_tag(&k, "a", "c1", 1, 2);
        assert_eq!(t, identity_tag(&k, "a", "c1", 1, 2));
        assert_ne!(t, identity_tag(&k, "b", "c1", 1, 2));
        assert_ne!(t, identity_tag(&k, "a", "c2", 1, 2));
        assert_ne!(t, identity_tag(&k, "a", "", 1, 2));
        // Lengths are bound: moving bytes between name and cluster changes the tag.
        assert_ne!(t, identity_tag(&k, "ac", "1", 1, 2));
        assert_ne!(t, identity_tag(&k, "a", "c1", 3, 2));
        assert_ne!(t, identity_tag(&k, "a", "c1", 1, 4));
        assert_ne!(t, identity_tag(&[8u8; 32], "a", "c1", 1, 2));
    }
}
