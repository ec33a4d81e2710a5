//! An shm connection's admission: `ShmJoin`, authenticated against the control session, the
//! bounce-buffer memfd verified before it is mapped; then the transport's target half
//! (`crate::transport::shm::serve_target`) serves it.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::{authenticated, first_frame, join_handshake, with_conn};
use crate::admission::Slot;
use crate::agent_state::AgentInner;
use crate::conn::{Conn, Sock};
use crate::error::Error;
use crate::mem::Mapping;
use crate::transport::shm::serve_target;
use crate::wire::Msg;

/// Largest bounce buffer an initiator may pass.
const MAX_BOUNCE: usize = 256 << 20;

pub(super) fn serve_shm(agent: Arc<AgentInner>, s: UnixStream, slot: Slot) {
    let from = crate::mem::peer_uid(s.as_raw_fd()).map_or_else(
        |_| "the shm socket".into(),
        |u| format!("the shm socket (uid {u})"),
    );
    let conn = Conn::new(Sock::Unix(s), "shm connection");
    let accepted = std::time::Instant::now();
    with_conn(&agent.clone(), conn, slot, &from, |c, slot| {
        let first = c.recv_frame(false)?;
        first_frame(&agent, c, slot, accepted);
        let (session, token, nonce) = match first {
            (
                Msg::ShmJoin {
                    session,
                    token,
                    nonce,
                },
                0,
            ) => (session, token, nonce),
            (m, _) => {
                return Err(Error::Protocol(format!(
                    "expected ShmJoin, got frame type {}",
                    m.kind()
                )))
            }
        };
        let fd = c
            .take_fd()
            .ok_or_else(|| Error::Protocol("ShmJoin without a bounce-buffer fd".into()))?;
        // The fd is neither inspected nor mapped before the peer proved its session.
        // Held while the connection is served: the session's end shuts it (and its ring) down.
        let (s, _member) = join_handshake(
            &agent,
            c,
            session,
            token,
            &session.to_le_bytes(),
            nonce,
            "shm",
        )?;
        let size = crate::mem::verify_memfd(fd.as_raw_fd(), None, false)?;
        if size == 0 || size > MAX_BOUNCE {
            return Err(Error::Protocol(format!(
                "bounce buffer of {size} bytes not in 1..={MAX_BOUNCE}"
            )));
        }
        let bounce = Mapping::map_fd(fd.as_raw_fd(), size, true)?;
        drop(fd);
        authenticated(&agent, c, slot)?;
        c.send(&Msg::Ok)?;
        serve_target(&agent, c, &bounce, &s.peer)
    });
}
