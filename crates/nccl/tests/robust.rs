//! Garbage, truncated and interleaved input: partial results with warnings, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_nccl::model::Scope;
use gdx_nccl::parse_text;
use proptest::prelude::*;

const FIXTURE: &str = include_str!("fixtures/gdr_disabled_no_module_nccl899.log");

#[test]
fn empty_and_non_nccl_text_warn_that_nothing_was_found() {
    for text in [
        "",
        "\n\n",
        "hello world\nTraceback (most recent call last):\n",
    ] {
        let log = parse_text("x.log", text);
        assert_eq!(log.nccl_lines, 0, "{text:?}");
        assert!(log.parse_warnings[0].message.contains("NCCL_DEBUG=INFO"));
    }
}

/// 8 MiB of channel lines between distinct rank pairs (issue 54: every connection's scope
/// scanned all connections, 86 s for this input). The per-rank facts are now gathered once,
/// so this finishes in about the time it takes to parse; the assertions check the counts, and
/// that the facts drawn from the lines (hosts, bus ids) are still the first ones printed.
#[test]
fn many_distinct_rank_pairs_are_classified_in_one_pass() {
    let mut text = String::new();
    let mut n = 0u32;
    while text.len() < 8 << 20 {
        let host = if n.is_multiple_of(2) {
            "hostA"
        } else {
            "hostB"
        };
        text.push_str(&format!(
            "{host}:1:2 [0] NCCL INFO Channel 00/0 : {n}[{:x}000] -> {}[1a000] via P2P/IPC\n",
            0x10 + n % 200,
            n + 1
        ));
        n += 1;
    }
    let log = parse_text("big.log", &text);
    assert_eq!(log.connections.len(), n as usize);
    let classes = log.pair_classes();
    let pairs: usize = classes.iter().map(|c| c.pairs).sum();
    assert_eq!(pairs, n as usize);
    // Rank 1 is the receiving end of line 0 (hostA) and the sending end of line 1 (hostB):
    // the first line printed wins, as before.
    assert_eq!(log.rank_host(1).as_deref(), Some("hostA"));
    assert_eq!(log.rank_bus_id(0).as_deref(), Some("10000"));
}

#[test]
fn a_log_cut_at_every_byte_still_parses_its_complete_lines() {
    let full = parse_text("full", FIXTURE);
    let mut last = 0;
    for cut in (0..FIXTURE.len()).filter(|i| FIXTURE.is_char_boundary(*i)) {
        let log = parse_text("cut", &FIXTURE[..cut]);
        // Facts only grow as more of the file is kept.
        assert!(log.connections.len() + log.gdr.len() >= last);
        last = log.connections.len() + log.gdr.len();
    }
    assert_eq!(last, full.connections.len() + full.gdr.len());
}

#[test]
fn two_hosts_interleaved_line_by_line_give_the_same_facts() {
    let (a, b): (Vec<&str>, Vec<&str>) = FIXTURE.lines().partition(|l| l.starts_with("2134"));
    let mut mixed: Vec<&str> = Vec::new();
    for i in 0..a.len().max(b.len()) {
        mixed.extend(b.get(i));
        mixed.extend(a.get(i));
    }
    let log = parse_text("mixed", &mixed.join("\n"));
    let orig = parse_text("orig", FIXTURE);
    assert_eq!(log.pair_classes(), orig.pair_classes());
    assert!(log
        .pair_classes()
        .iter()
        .all(|c| c.scope == Scope::InterNode));
}

#[test]
fn garbled_recognised_lines_become_warnings() {
    let text = "h:1:2 [0] NCCL INFO Channel 00 : 0[1a -> 1[1a000] via NET/IB/0\n\
                h:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA x 'mlx5_0'\n\
                h:1:2 [0] NCCL INFO NVLS multicast support is available on dev\n\
                h:1:2 [0] NCCL INFO DMA-BUF is available on GPU device zero\n\
                h:1:2 [0] NCCL INFO Channel 01 : 0[0] -> 1[0] via P2P/CUMEM\n";
    let log = parse_text("g", text);
    assert_eq!(log.parse_warnings.len(), 4, "{:#?}", log.parse_warnings);
    assert_eq!(log.connections.len(), 1);
    assert!(log
        .parse_warnings
        .iter()
        .all(|w| w.line >= 1 && w.source == "g"));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let text = String::from_utf8_lossy(&bytes);
        let log = parse_text("random", &text);
        let _ = log.pair_classes();
    }

    #[test]
    fn shuffled_and_spliced_fixture_lines_never_panic(
        picks in proptest::collection::vec((0usize..64, 0usize..200, any::<bool>()), 0..80)
    ) {
        let lines: Vec<&str> = FIXTURE.lines().collect();
        let mut text = String::new();
        for (i, cut, nl) in picks {
            let l = lines[i % lines.len()];
            let mut end = cut.min(l.len());
            while !l.is_char_boundary(end) { end -= 1; }
            text.push_str(&l[..end]);
            if nl { text.push('\n'); }
        }
        let log = parse_text("spliced", &text);
        let _ = log.pair_classes();
        let _ = log.hosts();
    }
}

#[test]
fn per_rank_debug_files_give_the_same_facts_as_one_combined_log() {
    // NCCL_DEBUG_FILE=nccl.%h.%p.log writes one file per process: split the two hosts apart.
    let dir = tempfile::tempdir().unwrap();
    let (a, b): (Vec<&str>, Vec<&str>) = FIXTURE.lines().partition(|l| l.starts_with("2134"));
    let fa = dir.path().join("nccl.21346d5cefce.5325.log");
    let fb = dir.path().join("nccl.6a5a91752e39.74352.log");
    std::fs::write(&fa, a.join("\n")).unwrap();
    std::fs::write(&fb, b.join("\n")).unwrap();
    let split = gdx_nccl::parse_files(&[&fa, &fb]).unwrap();
    let whole = parse_text("whole", FIXTURE);
    assert_eq!(split.sources.len(), 2);
    assert_eq!(split.pair_classes(), whole.pair_classes());
    assert_eq!(split.gdr, whole.gdr);
    assert!(gdx_nccl::parse_files(&[dir.path().join("absent.log")]).is_err());
}

#[test]
fn gdr_lines_with_a_mechanism_or_lower_case_are_read() {
    let log = parse_text(
        "m",
        "h:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'mlx5_0'\n\
         h:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1'\n",
    );
    assert_eq!(log.gdr.len(), 2);
    assert!(log.gdr[0].enabled);
    assert_eq!(log.gdr[0].reason.as_deref(), Some("DMABUF"));
    assert!(!log.gdr[1].enabled && log.gdr[1].reason.is_none());
}
