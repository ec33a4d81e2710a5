//! docs/wire-protocol.md matches the encoder byte for byte: every example frame in its
//! "Examples" section decodes to the message named beside it, and encoding that message gives
//! exactly the bytes printed. `GDX_PRINT_DOC_HEX=1` prints the blocks (for updating the doc).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_engine::wire::{decode_frame, encode, tag, Hello, Msg, ShmOp};
use gdx_engine::{Access, Error, IpcDesc, Location, RegionDesc, RegionKey};

const DOC: &str = include_str!("../../../docs/wire-protocol.md");

/// The examples, by the name their block carries in the doc (```` ```hex NAME ````).
fn examples() -> Vec<(&'static str, Msg)> {
    vec![
        (
            "hello",
            Msg::Hello(Hello {
                agent_name: "a".into(),
                agent_id: 1,
                host_id: 2,
                transports: 3,
                shm_socket: None,
                listen: Some("h:1".into()),
                session: 0,
                token: 0,
                streams: 2,
                nonce: 0x0f0e_0d0c_0b0a_0908_0706_0504_0302_0100,
                cluster: "c".into(),
            }),
        ),
        (
            "pake",
            Msg::Pake {
                nonce: 0x11,
                msg: [0x42; 33],
            },
        ),
        (
            "pakeauth",
            Msg::PakeAuth {
                msg: [0x41; 33],
                mac: [0xcd; 32],
            },
        ),
        (
            "challenge",
            Msg::Challenge {
                nonce: 0x11,
                mac: [0xab; 32],
            },
        ),
        ("auth", Msg::Auth { mac: [0xcd; 32] }),
        (
            "join",
            Msg::Join {
                session: 0x22,
                token: 0,
                stream: 1,
                nonce: 0x33,
            },
        ),
        (
            "region",
            Msg::Region(RegionDesc {
                id: 7,
                key: RegionKey(0x99),
                len: 4096,
                location: Location::Gpu(1),
                access: Access::READ_WRITE,
                shareable: false,
                name: Some("kv".into()),
                ipc: Some(IpcDesc {
                    host_id: "ab".into(),
                    pid: 5,
                    region: 3,
                    pci_bus_id: "0:1".into(),
                    len: 4096,
                    handle: "ff".into(),
                    posix_fd_alloc_len: Some(2 << 20),
                    offset: 0,
                    alloc_len: 4096,
                    pieces: Vec::new(),
                }),
                no_ipc: None,
            }),
        ),
    ]
}

fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| {
            c.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The bytes of the doc's block ```` ```hex NAME ````.
fn doc_block(name: &str) -> Option<Vec<u8>> {
    let start = DOC.find(&format!("```hex {name}\n"))?;
    let body = &DOC[start..].split_once('\n')?.1;
    let body = body.split_once("```")?.0;
    let digits: String = body.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).ok())
        .collect()
}

#[test]
fn doc_examples_decode_and_match_the_encoder() {
    let print = std::env::var("GDX_PRINT_DOC_HEX").is_ok();
    for (name, msg) in examples() {
        let enc = encode(&msg, 0);
        if print {
            println!("```hex {name}\n{}\n```\n", hex(&enc));
            continue;
        }
        let doc = doc_block(name).unwrap_or_else(|| panic!("no ```hex {name} block in the doc"));
        match decode_frame(&doc) {
            Ok(Some((m, 0, n))) => {
                assert_eq!(n, doc.len(), "{name}: trailing bytes");
                assert_eq!(m, msg, "{name}: the doc's bytes decode to another message");
            }
            other => panic!("{name}: the doc's bytes do not decode: {other:?}"),
        }
        assert_eq!(hex(&doc), hex(&enc), "{name}: doc and encoder differ");
    }
}

/// The prose agrees with the encoder too: the title and the header table name the version byte
/// the encoder writes (the doc once said 4 where the code sent 5).
#[test]
fn doc_version_matches_the_encoder() {
    let v = gdx_engine::wire::VERSION;
    let enc = encode(&Msg::Ok, 0);
    assert_eq!(enc[2], v, "the encoder writes VERSION at byte 2");
    let title = DOC.lines().next().unwrap_or_default();
    assert!(
        title.ends_with(&format!("version {v}")),
        "the doc's title says {title:?}, the encoder sends version {v}"
    );
    let row = DOC
        .lines()
        .find(|l| l.starts_with("| 2 | 1 | version |"))
        .expect("the header table's version row");
    assert!(
        row.contains(&format!("`{v}`")),
        "the header table says {row:?}, the encoder sends version {v}"
    );
}

/// The checked-in seed corpus of the `frame_decoder` fuzz target: one whole frame per file.
const SEEDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/frame_decoder");

fn seed_messages() -> Vec<(String, Msg)> {
    let mut v: Vec<(String, Msg)> = examples()
        .into_iter()
        .map(|(n, m)| (n.to_string(), m))
        .collect();
    let op = ShmOp {
        write: true,
        region: 7,
        key: RegionKey(0x99),
        offset: 8,
        len: 64,
    };
    let more = [
        ("ok", Msg::Ok),
        ("bye", Msg::Bye),
        ("list", Msg::ListRegions),
        ("get", Msg::GetRegion { name: "kv".into() }),
        ("err", Msg::Err(Error::BadKey { region: 7 })),
        (
            "limit",
            Msg::Err(Error::LimitReached {
                what: "max_pending".into(),
                limit: 32,
            }),
        ),
        (
            "write",
            Msg::Write {
                xfer: 1,
                op: 0,
                chunk: 0,
                region: 7,
                key: RegionKey(0x99),
                offset: 0,
            },
        ),
        (
            "read",
            Msg::Read {
                xfer: 1,
                op: 0,
                chunk: 0,
                region: 7,
                key: RegionKey(0x99),
                offset: 0,
                len: 64,
            },
        ),
        (
            "notify",
            Msg::Notify {
                xfer: 2,
                data: b"ready".to_vec(),
            },
        ),
        (
            "shmjoin",
            Msg::ShmJoin {
                session: 0x22,
                token: 0,
                nonce: 0x44,
            },
        ),
        (
            "shmbegin",
            Msg::ShmBegin {
                xfer: 3,
                ops: vec![op; 3],
            },
        ),
        (
            "shmresult",
            Msg::ShmBeginResult {
                errors: vec![(
                    1,
                    Error::OutOfBounds {
                        offset: 1,
                        len: 2,
                        region_len: 3,
                    },
                )],
            },
        ),
        (
            "shmring",
            Msg::ShmRing {
                slots: 32,
                slot_bytes: 256 << 10,
            },
        ),
        (
            "shmend",
            Msg::ShmEnd {
                xfer: 3,
                notify: Some(b"done".to_vec()),
            },
        ),
    ];
    v.extend(more.into_iter().map(|(n, m)| (n.to_string(), m)));
    v
}

/// Every seed is a valid frame of this version (so the fuzzer starts from real messages);
/// `GDX_WRITE_FUZZ_SEEDS=1` rewrites them.
#[test]
fn fuzz_seed_corpus_is_current() {
    let seeds = seed_messages();
    if std::env::var("GDX_WRITE_FUZZ_SEEDS").is_ok() {
        std::fs::create_dir_all(SEEDS).unwrap();
        for (name, m) in &seeds {
            std::fs::write(format!("{SEEDS}/{name}"), encode(m, 0)).unwrap();
        }
    }
    for (name, m) in &seeds {
        let b = std::fs::read(format!("{SEEDS}/{name}"))
            .unwrap_or_else(|e| panic!("seed {name}: {e} (GDX_WRITE_FUZZ_SEEDS=1 writes them)"));
        assert_eq!(b, encode(m, 0), "seed {name} is stale");
        assert!(matches!(decode_frame(&b), Ok(Some(_))), "seed {name}");
    }
}

/// The "Messages" table of docs/wire-protocol.md numbers every frame as `wire::tag` does, and
/// names no frame the table lacks.
#[test]
fn doc_message_table_matches_the_tag_table() {
    let start = DOC.find("## Messages").expect("a Messages section");
    let end = start
        + DOC[start..]
            .find("\n## Authentication")
            .expect("a next section");
    let rows: Vec<(String, u8)> = DOC[start..end]
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let n = cells.next()?.parse::<u8>().ok()?;
            Some((cells.next()?.to_string(), n))
        })
        .collect();
    let table: Vec<(String, u8)> = tag::ALL.iter().map(|(f, n)| (f.to_string(), *n)).collect();
    let mut rows_sorted = rows.clone();
    rows_sorted.sort_by_key(|r| r.1);
    let mut table_sorted = table.clone();
    table_sorted.sort_by_key(|r| r.1);
    assert_eq!(
        rows_sorted, table_sorted,
        "docs/wire-protocol.md vs wire::tag::ALL"
    );
    assert_eq!(table_sorted.last().map(|r| r.1), Some(tag::MAX));
}
