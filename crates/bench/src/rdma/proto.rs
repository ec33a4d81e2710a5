//! The control protocol between an rdma case and the bench server (`gdx serve --rdma-listen`):
//! length-prefixed JSON frames over a [`Control`] channel (a TCP stream in practice,
//! [`TcpControl`]) carrying each side's [`ConnData`] and the server's buffer as a
//! [`RemoteRegion`]. Only set-up and verification travel here; the measured operations are
//! one-sided RDMA.
//!
//! Errors are gdx-rdma's [`RdmaError::Control`]: the server reports them through
//! `gdx serve`, the cases keep them as the source of their [`crate::BenchError::Rdma`].

use gdx_rdma::link::LinkMem;
use gdx_rdma::{ConnData, Mechanism, RdmaError, RdmaOp, RemoteRegion};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Protocol version of the bench messages.
pub const BENCH_VERSION: u32 = 1;
/// Largest control message.
pub(crate) const MAX_MSG: usize = 1 << 20;

/// Which operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    /// RDMA WRITE (local → remote).
    Write,
    /// RDMA READ (remote → local).
    Read,
}

impl From<BenchOp> for RdmaOp {
    fn from(op: BenchOp) -> RdmaOp {
        match op {
            BenchOp::Write => RdmaOp::Write,
            BenchOp::Read => RdmaOp::Read,
        }
    }
}

/// Where a side's buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchMem {
    /// Host memory.
    Host,
    /// GPU memory (CUDA ordinal).
    Gpu(u32),
}

impl BenchMem {
    /// `host` or `gpu<n>`, as bench keys spell it.
    pub fn name(self) -> String {
        match self {
            BenchMem::Host => "host".into(),
            BenchMem::Gpu(n) => format!("gpu{n}"),
        }
    }
}

impl From<BenchMem> for LinkMem {
    fn from(m: BenchMem) -> LinkMem {
        match m {
            BenchMem::Host => LinkMem::Host,
            BenchMem::Gpu(n) => LinkMem::Gpu(n),
        }
    }
}

/// The bench key for an operation between two memories.
pub fn bench_key(op: BenchOp, local: BenchMem, remote: BenchMem) -> String {
    match op {
        BenchOp::Write => format!("{}_to_remote_{}_rdma_write", local.name(), remote.name()),
        BenchOp::Read => format!("remote_{}_to_{}_rdma_read", remote.name(), local.name()),
    }
}

/// A message channel between the two bench sides.
pub trait Control {
    /// Send one message.
    ///
    /// # Errors
    /// [`RdmaError::Control`] when the channel fails.
    fn send(&mut self, msg: &[u8]) -> Result<(), RdmaError>;
    /// Receive one message, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`RdmaError::Control`] when the channel fails or the wait runs out.
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, RdmaError>;
}

/// [`Control`] over a TCP stream: each message is a little-endian u32 length and the bytes.
#[derive(Debug)]
pub struct TcpControl(pub TcpStream);

pub(crate) fn io(e: std::io::Error) -> RdmaError {
    RdmaError::Control(e.to_string())
}

impl Control for TcpControl {
    fn send(&mut self, msg: &[u8]) -> Result<(), RdmaError> {
        write_frame(&mut self.0, msg)
    }
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, RdmaError> {
        self.0
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(io)?;
        read_frame(&mut self.0)
    }
}

/// Write one length-prefixed frame.
///
/// # Errors
/// [`RdmaError::Control`] for a message over 1 MiB or a failed write.
pub fn write_frame(w: &mut impl Write, msg: &[u8]) -> Result<(), RdmaError> {
    if msg.len() > MAX_MSG {
        return Err(RdmaError::Control(format!(
            "message of {} bytes is too large",
            msg.len()
        )));
    }
    w.write_all(&(msg.len() as u32).to_le_bytes()).map_err(io)?;
    w.write_all(msg).map_err(io)?;
    w.flush().map_err(io)
}

/// Read one length-prefixed frame (at most 1 MiB).
///
/// # Errors
/// [`RdmaError::Control`] for a larger announced length or a failed read.
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, RdmaError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(io)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MSG {
        return Err(RdmaError::Control(format!(
            "peer announced a {len}-byte message"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(crate) enum Msg {
    Hello {
        version: u32,
        op: BenchOp,
        mem: BenchMem,
        len: u64,
        qps: u16,
        conn: ConnData,
    },
    Ready {
        conn: ConnData,
        region: RemoteRegion,
        mechanism: Mechanism,
    },
    /// Sent by the client after each size, so the server's waits stay short.
    Progress {
        size: u64,
    },
    Checksum {
        len: u64,
    },
    Sum {
        value: Option<u64>,
    },
    Done,
    Error {
        reason: String,
    },
    /// The server cannot serve the memory asked for because a library is missing there (no
    /// CUDA driver for GPU memory): the case cannot run against this peer, which is not a
    /// failure of the path.
    Unavailable {
        library: String,
        reason: String,
    },
}

pub(crate) fn send(c: &mut dyn Control, m: &Msg) -> Result<(), RdmaError> {
    let b = serde_json::to_vec(m).map_err(|e| RdmaError::Control(e.to_string()))?;
    c.send(&b)
}

pub(crate) fn recv(c: &mut dyn Control, timeout: Duration) -> Result<Msg, RdmaError> {
    let b = c.recv(timeout)?;
    match serde_json::from_slice(&b).map_err(|e| RdmaError::Control(format!("bad message: {e}")))? {
        Msg::Error { reason } => Err(RdmaError::Control(format!("peer: {reason}"))),
        Msg::Unavailable { library, reason } => Err(RdmaError::Library(gdx_sys::Unavailable {
            library: format!("the peer's {library}"),
            reason,
        })),
        m => Ok(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_bench_naming() {
        assert_eq!(
            bench_key(BenchOp::Write, BenchMem::Gpu(0), BenchMem::Host),
            "gpu0_to_remote_host_rdma_write"
        );
        assert_eq!(
            bench_key(BenchOp::Read, BenchMem::Host, BenchMem::Gpu(1)),
            "remote_gpu1_to_host_rdma_read"
        );
    }

    #[test]
    fn frames_round_trip_and_refuse_huge_lengths() {
        let mut v = Vec::new();
        write_frame(&mut v, b"hello").unwrap();
        assert_eq!(read_frame(&mut v.as_slice()).unwrap(), b"hello");
        let huge = ((MAX_MSG as u32) + 1).to_le_bytes();
        assert!(read_frame(&mut huge.as_slice()).is_err());
        assert!(read_frame(&mut [1u8, 0].as_slice()).is_err());
    }

    #[test]
    fn messages_round_trip_as_json() {
        let m = Msg::Progress { size: 4096 };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, r#"{"msg":"progress","size":4096}"#);
        assert!(matches!(
            serde_json::from_str(&j).unwrap(),
            Msg::Progress { size: 4096 }
        ));
        let e: Result<Msg, _> = serde_json::from_str(r#"{"msg":"error","reason":"no NIC"}"#);
        assert!(matches!(e, Ok(Msg::Error { reason }) if reason == "no NIC"));
    }
}
