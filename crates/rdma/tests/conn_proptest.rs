//! Connection data encoding, property-tested: every valid value round-trips through the
//! binary and JSON forms, and no input (random, truncated or mutated) panics the decoder.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::conn::{ConnData, QpInfo, RemoteRegion, MAX_24BIT};
use gdx_rdma::LinkKind;
use proptest::prelude::*;
use std::net::Ipv6Addr;

fn conn_data() -> impl Strategy<Value = ConnData> {
    (
        "[a-z0-9_]{0,64}",
        1u8..=255,
        any::<bool>(),
        any::<u16>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        prop::sample::select(vec![256u32, 512, 1024, 2048, 4096]),
        any::<u8>(),
        prop::collection::vec((1u32..=MAX_24BIT, 0u32..=MAX_24BIT), 1..=64),
        prop::collection::vec(
            (
                any::<u64>(),
                0u64..u64::MAX / 2,
                1u64..u64::MAX / 2,
                any::<u32>(),
            ),
            0..20,
        ),
    )
        .prop_map(
            |(device, port, eth, lid, gid, gid_index, mtu_bytes, max_rd_atomic, qps, regions)| {
                ConnData {
                    device,
                    port,
                    link: if eth {
                        LinkKind::Ethernet
                    } else {
                        LinkKind::InfiniBand
                    },
                    lid,
                    gid: Ipv6Addr::from(gid),
                    gid_index,
                    mtu_bytes,
                    max_rd_atomic,
                    qps: qps
                        .into_iter()
                        .map(|(qpn, psn)| QpInfo { qpn, psn })
                        .collect(),
                    regions: regions
                        .into_iter()
                        .map(|(id, addr, len, rkey)| RemoteRegion {
                            id,
                            addr,
                            len,
                            rkey,
                        })
                        .collect(),
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn binary_round_trip(c in conn_data()) {
        let b = c.encode().unwrap();
        prop_assert_eq!(ConnData::decode(&b).unwrap(), c);
    }

    #[test]
    fn json_round_trip(c in conn_data()) {
        let j = serde_json::to_vec(&c).unwrap();
        prop_assert_eq!(serde_json::from_slice::<ConnData>(&j).unwrap(), c);
    }

    #[test]
    fn garbage_never_panics(b in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = ConnData::decode(&b);
    }

    #[test]
    fn garbage_after_a_valid_header_never_panics(
        c in conn_data(),
        tail in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut b = c.encode().unwrap();
        let keep = b.len().min(14);
        b.truncate(keep);
        b.extend_from_slice(&tail);
        let _ = ConnData::decode(&b);
    }

    #[test]
    fn truncations_are_errors(c in conn_data(), cut in any::<prop::sample::Index>()) {
        let b = c.encode().unwrap();
        let n = cut.index(b.len());
        prop_assert!(ConnData::decode(&b[..n]).is_err());
    }

    #[test]
    fn one_flipped_byte_never_panics_and_decodes_only_to_valid_data(
        c in conn_data(),
        at in any::<prop::sample::Index>(),
        bits in 1u8..=255,
    ) {
        let mut b = c.encode().unwrap();
        let i = at.index(b.len());
        b[i] ^= bits;
        if let Ok(d) = ConnData::decode(&b) {
            prop_assert!(d.validate().is_ok());
        }
    }
}
