//! docs/wire-protocol.md matches the encoder byte for byte: every example frame in its
//! "Examples" section decodes to the message named beside it, and encoding that message gives
//! exactly the bytes printed. `GDX_PRINT_DOC_HEX=1` prints the blocks (for updating the doc).

use gdx_engine::wire::{decode_frame, encode, Hello, Msg};
use gdx_engine::{Access, IpcDesc, Location, RegionDesc, RegionKey};

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
            }),
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
                }),
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
