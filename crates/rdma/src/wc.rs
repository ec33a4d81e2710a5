//! Work completion statuses by name ([`WcStatus`], every `enum ibv_wc_status` code) and the
//! error a failed one becomes ([`WcError`]), with what it usually means.
//!
//! Invariant: [`WcStatus::from_code`] is total: a code this build does not know becomes
//! [`WcStatus::Unknown`], never a panic.

use std::fmt;

/// The status of one work completion (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS` (0).
    Success,
    /// `IBV_WC_LOC_LEN_ERR` (1): a local length is wrong (e.g. larger than the port allows).
    LocalLength,
    /// `IBV_WC_LOC_QP_OP_ERR` (2): internal QP consistency error.
    LocalQpOperation,
    /// `IBV_WC_LOC_EEC_OP_ERR` (3): EE context error (RD only).
    LocalEecOperation,
    /// `IBV_WC_LOC_PROT_ERR` (4): the local buffer is not inside a region registered with
    /// this lkey, on this protection domain, with the needed access.
    LocalProtection,
    /// `IBV_WC_WR_FLUSH_ERR` (5): flushed because the QP went to the error state (an earlier
    /// request failed, or the QP is being torn down).
    Flushed,
    /// `IBV_WC_MW_BIND_ERR` (6): memory window bind failed.
    MemoryWindowBind,
    /// `IBV_WC_BAD_RESP_ERR` (7): unexpected transport response from the peer.
    BadResponse,
    /// `IBV_WC_LOC_ACCESS_ERR` (8): local access violation (e.g. READ into a region without
    /// local write).
    LocalAccess,
    /// `IBV_WC_REM_INV_REQ_ERR` (9): the peer found the request invalid (e.g. length over its
    /// limit, or an operation its QP does not allow).
    RemoteInvalidRequest,
    /// `IBV_WC_REM_ACCESS_ERR` (10): the peer refused the access: wrong rkey, outside the
    /// remote region, or the region lacks remote read/write.
    RemoteAccess,
    /// `IBV_WC_REM_OP_ERR` (11): the peer could not complete the operation.
    RemoteOperation,
    /// `IBV_WC_RETRY_EXC_ERR` (12): no ACK after `retry_cnt` retries: the peer is gone, its
    /// QP is not in RTR/RTS, or the path is wrong (GID, LID, MTU, routing, PFC).
    RetryExceeded,
    /// `IBV_WC_RNR_RETRY_EXC_ERR` (13): receiver not ready after `rnr_retry` retries.
    RnrRetryExceeded,
    /// `IBV_WC_LOC_RDD_VIOL_ERR` (14): RD domain violation.
    LocalRddViolation,
    /// `IBV_WC_REM_INV_RD_REQ_ERR` (15): remote invalid RD request.
    RemoteInvalidRdRequest,
    /// `IBV_WC_REM_ABORT_ERR` (16): the peer aborted the operation.
    RemoteAborted,
    /// `IBV_WC_INV_EECN_ERR` (17): invalid EE context number.
    InvalidEecn,
    /// `IBV_WC_INV_EEC_STATE_ERR` (18): invalid EE context state.
    InvalidEecState,
    /// `IBV_WC_FATAL_ERR` (19): fatal device error.
    Fatal,
    /// `IBV_WC_RESP_TIMEOUT_ERR` (20): response timeout.
    ResponseTimeout,
    /// `IBV_WC_GENERAL_ERR` (21): other error; see the vendor syndrome.
    General,
    /// `IBV_WC_TM_ERR` (22): tag matching error.
    TagMatching,
    /// `IBV_WC_TM_RNDV_INCOMPLETE` (23): tag matching rendezvous incomplete.
    TagMatchingRendezvousIncomplete,
    /// A code this build does not know.
    Unknown(u32),
}

/// Every named status with its code and libibverbs name, in code order.
const TABLE: [(WcStatus, u32, &str); 24] = [
    (WcStatus::Success, 0, "IBV_WC_SUCCESS"),
    (WcStatus::LocalLength, 1, "IBV_WC_LOC_LEN_ERR"),
    (WcStatus::LocalQpOperation, 2, "IBV_WC_LOC_QP_OP_ERR"),
    (WcStatus::LocalEecOperation, 3, "IBV_WC_LOC_EEC_OP_ERR"),
    (WcStatus::LocalProtection, 4, "IBV_WC_LOC_PROT_ERR"),
    (WcStatus::Flushed, 5, "IBV_WC_WR_FLUSH_ERR"),
    (WcStatus::MemoryWindowBind, 6, "IBV_WC_MW_BIND_ERR"),
    (WcStatus::BadResponse, 7, "IBV_WC_BAD_RESP_ERR"),
    (WcStatus::LocalAccess, 8, "IBV_WC_LOC_ACCESS_ERR"),
    (WcStatus::RemoteInvalidRequest, 9, "IBV_WC_REM_INV_REQ_ERR"),
    (WcStatus::RemoteAccess, 10, "IBV_WC_REM_ACCESS_ERR"),
    (WcStatus::RemoteOperation, 11, "IBV_WC_REM_OP_ERR"),
    (WcStatus::RetryExceeded, 12, "IBV_WC_RETRY_EXC_ERR"),
    (WcStatus::RnrRetryExceeded, 13, "IBV_WC_RNR_RETRY_EXC_ERR"),
    (WcStatus::LocalRddViolation, 14, "IBV_WC_LOC_RDD_VIOL_ERR"),
    (
        WcStatus::RemoteInvalidRdRequest,
        15,
        "IBV_WC_REM_INV_RD_REQ_ERR",
    ),
    (WcStatus::RemoteAborted, 16, "IBV_WC_REM_ABORT_ERR"),
    (WcStatus::InvalidEecn, 17, "IBV_WC_INV_EECN_ERR"),
    (WcStatus::InvalidEecState, 18, "IBV_WC_INV_EEC_STATE_ERR"),
    (WcStatus::Fatal, 19, "IBV_WC_FATAL_ERR"),
    (WcStatus::ResponseTimeout, 20, "IBV_WC_RESP_TIMEOUT_ERR"),
    (WcStatus::General, 21, "IBV_WC_GENERAL_ERR"),
    (WcStatus::TagMatching, 22, "IBV_WC_TM_ERR"),
    (
        WcStatus::TagMatchingRendezvousIncomplete,
        23,
        "IBV_WC_TM_RNDV_INCOMPLETE",
    ),
];

impl WcStatus {
    /// The status for a raw code; [`WcStatus::Unknown`] for codes past the table.
    pub fn from_code(code: u32) -> WcStatus {
        TABLE
            .iter()
            .find(|(_, c, _)| *c == code)
            .map_or(WcStatus::Unknown(code), |(s, _, _)| *s)
    }

    /// The raw code.
    pub fn code(self) -> u32 {
        match self {
            WcStatus::Unknown(c) => c,
            s => TABLE
                .iter()
                .find(|(t, _, _)| *t == s)
                .map_or(u32::MAX, |(_, c, _)| *c),
        }
    }

    /// The libibverbs name, e.g. `IBV_WC_REM_ACCESS_ERR`; `None` for an unknown code.
    pub fn verbs_name(self) -> Option<&'static str> {
        TABLE
            .iter()
            .find(|(s, _, _)| *s == self)
            .map(|(_, _, n)| *n)
    }

    /// Whether the operation succeeded.
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }

    /// What the status usually means and where to look, in one clause.
    pub fn hint(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocalLength => "a local length is invalid (larger than the port or QP allows)",
            WcStatus::LocalQpOperation => "internal queue pair consistency error on this side",
            WcStatus::LocalProtection => {
                "the local buffer is not inside a region registered with this lkey on this device"
            }
            WcStatus::Flushed => {
                "flushed: the queue pair went to the error state because an earlier request failed or it is being torn down"
            }
            WcStatus::LocalAccess => "local access violation: the local region lacks the needed access",
            WcStatus::RemoteInvalidRequest => {
                "the peer found the request invalid (length over its limit, or its QP does not allow the operation)"
            }
            WcStatus::RemoteAccess => {
                "the peer refused access: wrong rkey, outside the remote region, or the region lacks remote read/write"
            }
            WcStatus::RemoteOperation => "the peer could not complete the operation",
            WcStatus::RetryExceeded => {
                "no acknowledgement after all retries: the peer is gone or not connected, or the path (GID, LID, MTU, routing, PFC) is wrong"
            }
            WcStatus::RnrRetryExceeded => "receiver not ready after all RNR retries",
            WcStatus::BadResponse => "unexpected transport response from the peer",
            WcStatus::RemoteAborted => "the peer aborted the operation",
            WcStatus::Fatal => "fatal device error: the device needs a reset",
            WcStatus::ResponseTimeout => "response timeout",
            WcStatus::General => "general error: see the vendor syndrome",
            WcStatus::MemoryWindowBind => "memory window bind failed",
            WcStatus::LocalEecOperation
            | WcStatus::LocalRddViolation
            | WcStatus::RemoteInvalidRdRequest
            | WcStatus::InvalidEecn
            | WcStatus::InvalidEecState => "reliable-datagram (RD) error; not expected on RC queue pairs",
            WcStatus::TagMatching | WcStatus::TagMatchingRendezvousIncomplete => {
                "tag-matching error; not expected for RDMA write/read"
            }
            WcStatus::Unknown(_) => "a status this build does not know",
        }
    }
}

impl fmt::Display for WcStatus {
    /// `IBV_WC_REM_ACCESS_ERR (10)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.verbs_name() {
            Some(n) => write!(f, "{n} ({})", self.code()),
            None => write!(f, "unknown work completion status {}", self.code()),
        }
    }
}

/// A work request that completed with an error status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{op} of {len} bytes on {device} QP {qp_num:#x} (remote {remote_addr:#x}, rkey {rkey:#x}) \
     failed: {status}, vendor syndrome {vendor_err:#x}: {}", status.hint()
)]
pub struct WcError {
    /// The status.
    pub status: WcStatus,
    /// The vendor syndrome.
    pub vendor_err: u32,
    /// `RDMA write` or `RDMA read`.
    pub op: &'static str,
    /// RDMA device.
    pub device: String,
    /// Local queue pair number.
    pub qp_num: u32,
    /// Bytes of the failed request.
    pub len: u64,
    /// Remote address of the failed request.
    pub remote_addr: u64,
    /// Remote key of the failed request.
    pub rkey: u32,
}

impl WcError {
    /// Whether the peer refused the access (wrong rkey, bounds or rights).
    pub fn is_remote_access(&self) -> bool {
        self.status == WcStatus::RemoteAccess
    }
    /// Whether the transport gave up retrying (peer gone or path wrong).
    pub fn is_retry_exceeded(&self) -> bool {
        matches!(
            self.status,
            WcStatus::RetryExceeded | WcStatus::RnrRetryExceeded
        )
    }
    /// Whether the local buffer or lkey was wrong.
    pub fn is_local_protection(&self) -> bool {
        matches!(
            self.status,
            WcStatus::LocalProtection | WcStatus::LocalAccess
        )
    }
    /// Whether this request was only flushed after an earlier failure.
    pub fn is_flushed(&self) -> bool {
        self.status == WcStatus::Flushed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_has_a_name() {
        for code in 0..24 {
            let s = WcStatus::from_code(code);
            assert!(!matches!(s, WcStatus::Unknown(_)), "{code}");
            assert_eq!(s.code(), code);
            assert!(s.verbs_name().unwrap().starts_with("IBV_WC_"));
            assert!(!s.hint().is_empty());
        }
        assert_eq!(WcStatus::from_code(24), WcStatus::Unknown(24));
        assert_eq!(WcStatus::Unknown(99).code(), 99);
        assert_eq!(WcStatus::from_code(u32::MAX).verbs_name(), None);
    }

    #[test]
    fn codes_match_rdma_core() {
        use rdma_codes::*;
        assert_eq!(WcStatus::from_code(SUCCESS), WcStatus::Success);
        assert_eq!(WcStatus::from_code(LOC_PROT), WcStatus::LocalProtection);
        assert_eq!(WcStatus::from_code(FLUSH), WcStatus::Flushed);
        assert_eq!(WcStatus::from_code(REM_ACCESS), WcStatus::RemoteAccess);
        assert_eq!(WcStatus::from_code(RETRY_EXC), WcStatus::RetryExceeded);
        assert_eq!(
            WcStatus::from_code(TM_RNDV),
            WcStatus::TagMatchingRendezvousIncomplete
        );
    }

    /// The values from verbs.h (`enum ibv_wc_status`), written out independently.
    mod rdma_codes {
        pub const SUCCESS: u32 = 0;
        pub const LOC_PROT: u32 = 4;
        pub const FLUSH: u32 = 5;
        pub const REM_ACCESS: u32 = 10;
        pub const RETRY_EXC: u32 = 12;
        pub const TM_RNDV: u32 = 23;
    }

    #[test]
    fn errors_name_the_status_and_what_it_means() {
        let e = WcError {
            status: WcStatus::RemoteAccess,
            vendor_err: 0x88,
            op: "RDMA write",
            device: "mlx5_0".into(),
            qp_num: 0x1234,
            len: 4096,
            remote_addr: 0x7f00_0000_0000,
            rkey: 0xabc,
        };
        let text = e.to_string();
        assert!(
            text.starts_with("RDMA write of 4096 bytes on mlx5_0 QP 0x1234"),
            "{text}"
        );
        assert!(text.contains("IBV_WC_REM_ACCESS_ERR (10)"), "{text}");
        assert!(text.contains("wrong rkey"), "{text}");
        assert!(e.is_remote_access() && !e.is_flushed());
        let f = WcError {
            status: WcStatus::Flushed,
            ..e.clone()
        };
        assert!(f.is_flushed());
        let r = WcError {
            status: WcStatus::RetryExceeded,
            ..e.clone()
        };
        assert!(r.is_retry_exceeded());
        let l = WcError {
            status: WcStatus::LocalProtection,
            ..e
        };
        assert!(l.is_local_protection());
    }
}
