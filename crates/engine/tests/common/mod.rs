//! Helpers shared by the integration tests.
#![allow(dead_code)]

use gdx_engine::{Agent, AgentConfig, Path, Peer, Secret, Transports};
use std::path::PathBuf;
use std::time::Duration;

/// A secret file (mode 600) shared by this test process and the processes it starts
/// (`GDX_SECRET_FILE`), so two-process tests authenticate like real deployments.
pub fn secret_file() -> PathBuf {
    static F: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        if let Ok(p) = std::env::var("GDX_SECRET_FILE") {
            return PathBuf::from(p);
        }
        // Under the target dir, not $TMPDIR: nothing is left outside the build. A test binary
        // carried to another machine (the GPU machine) has no such folder: it is made.
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join(format!("gdx-test-secret-{}", std::process::id()));
        Secret::generate().unwrap().write_file(&p).unwrap();
        p
    })
    .clone()
}

/// The secret of [`secret_file`].
pub fn shared_secret() -> Secret {
    Secret::from_file(&secret_file()).unwrap()
}

// Test data comes from gdx-base's one pattern: seeded, different at every offset, and the same
// bytes the probes and benchmarks write, so a failure can be replayed from its seed anywhere.
#[allow(unused_imports)] // each test binary uses its own part
pub use gdx_base::pattern::{fill_pattern, pattern};

pub fn config(name: &str, shm: bool) -> AgentConfig {
    AgentConfig {
        name: name.into(),
        transports: Transports {
            tcp: true,
            shm,
            rdma: true,
            fabric: false,
        },
        io_timeout: Duration::from_secs(20),
        secret: Some(shared_secret()),
        ..AgentConfig::default()
    }
}

pub fn agent(name: &str, shm: bool) -> Agent {
    Agent::new(config(name, shm)).expect("agent")
}

pub const WAIT: Duration = Duration::from_secs(120);

/// Position of the first differing byte, for readable assertion messages on huge buffers.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}
/// Stops process `pid` (SIGSTOP) and waits, at most 10 s, until every thread of it is stopped
/// (`T` in `/proc/PID/task/*/stat`): a signal is delivered asynchronously, and a test must not
/// race a still-running peer.
pub fn stop(pid: u32) {
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -STOP {pid}");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let all = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("/proc/PID/task")
            .filter_map(|t| t.ok())
            .all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the parenthesised command name.
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
            });
        if all {
            return;
        }
        assert!(std::time::Instant::now() < until, "{pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A raw, hand-made client of the wire protocol (version 3), written from
/// docs/wire-protocol.md: it lets hostile tests send exactly the frames they want.
pub mod shm_raw;

/// A throttled, cuttable tcp relay for the rail tests.
pub mod relay;

pub mod raw {
    use gdx_engine::wire::{decode_frame, encode, Hello, Msg};
    use hmac::{Hmac, Mac};
    use sha2::Sha256;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    /// HMAC-SHA256(key, label ‖ 0 ‖ parts…), as the doc defines proofs.
    pub fn hmac(key: &[u8], label: &str, parts: &[&[u8]]) -> [u8; 32] {
        let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
        m.update(label.as_bytes());
        m.update(&[0]);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// Reads one frame (None on EOF, error or 5 s of silence).
    pub fn read_msg(s: &mut TcpStream) -> Option<Msg> {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        loop {
            // One request, one reply: nothing follows a reply before the next request.
            if let Ok(Some((m, _, _))) = decode_frame(&buf) {
                return Some(m);
            }
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
    }

    pub fn send(s: &mut TcpStream, m: &Msg) {
        s.write_all(&encode(m, 0)).unwrap();
    }

    /// True once the peer closed the connection.
    pub fn closed(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 256];
        loop {
            match s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue, // an Err frame before the close
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                }
            }
        }
    }

    /// An authenticated control session made by hand.
    pub struct Session {
        pub control: TcpStream,
        pub hello: Hello,
        pub key: [u8; 32],
    }

    /// The initiator's SPAKE2 message and state for `secret` (as docs/wire-protocol.md says).
    pub fn pake_start(secret: &[u8]) -> (spake2::Spake2<spake2::Ed25519Group>, [u8; 33]) {
        let (st, m) = spake2::Spake2::<spake2::Ed25519Group>::start_a(
            &spake2::Password::new(secret),
            &spake2::Identity::new(b"gdx/7 initiator"),
            &spake2::Identity::new(b"gdx/7 acceptor"),
        );
        (st, m.try_into().unwrap())
    }

    /// The control handshake with `secret`, made by hand: Hello → Pake → PakeAuth → Hello,
    /// the reply's identity tag checked under the session key.
    pub fn login(addr: SocketAddr, secret: &[u8]) -> Session {
        let mut c = TcpStream::connect(addr).unwrap();
        let (cn, id) = (0x1111_2222_3333_4444_5555_6666_7777_8888u128, 42u128);
        send(
            &mut c,
            &Msg::Hello(Hello {
                agent_name: "raw".into(),
                agent_id: id,
                nonce: cn,
                ..Hello::default()
            }),
        );
        let Some(Msg::Pake { nonce: sn, msg }) = read_msg(&mut c) else {
            panic!("no Pake")
        };
        let (st, mine) = pake_start(secret);
        let k: [u8; 32] = st.finish(&msg).unwrap().try_into().unwrap();
        let t = [&id.to_le_bytes()[..], &cn.to_le_bytes(), &sn.to_le_bytes()];
        let mac = hmac(&k, "gdx/7 control initiator", &t);
        send(&mut c, &Msg::PakeAuth { msg: mine, mac });
        let Some(Msg::Hello(hello)) = read_msg(&mut c) else {
            panic!("no Hello after PakeAuth")
        };
        let key = hmac(&k, "gdx/7 session key", &t);
        let name = hello.agent_name.as_bytes();
        let tag = hmac(
            &key,
            "gdx/7 acceptor identity",
            &[
                &(name.len() as u64).to_le_bytes(),
                name,
                &(hello.cluster.len() as u64).to_le_bytes(),
                hello.cluster.as_bytes(),
                &hello.agent_id.to_le_bytes(),
                &hello.session.to_le_bytes(),
            ],
        );
        let tag = u128::from_le_bytes(tag[..16].try_into().unwrap());
        assert_eq!(
            hello.token, tag,
            "the acceptor's identity tag (its key confirmation)"
        );
        Session {
            control: c,
            hello,
            key,
        }
    }

    /// Joins data stream `stream` of `s`.
    pub fn join(addr: SocketAddr, s: &Session, stream: u16) -> TcpStream {
        let mut d = TcpStream::connect(addr).unwrap();
        let (session, cn) = (s.hello.session, 7u128);
        send(
            &mut d,
            &Msg::Join {
                session,
                token: 0,
                stream,
                nonce: cn,
            },
        );
        let Some(Msg::Challenge { nonce: sn, mac }) = read_msg(&mut d) else {
            panic!("no Challenge on Join")
        };
        let t = [
            &session.to_le_bytes()[..],
            &stream.to_le_bytes(),
            &cn.to_le_bytes(),
            &sn.to_le_bytes(),
        ];
        assert_eq!(mac, hmac(&s.key, "gdx/3 join acceptor", &t));
        send(
            &mut d,
            &Msg::Auth {
                mac: hmac(&s.key, "gdx/3 join initiator", &t),
            },
        );
        assert_eq!(read_msg(&mut d), Some(Msg::Ok));
        d
    }
}

/// An agent with the fabric transport on (tcp and shm too), on host `host`.
/// A `target` agent (host id `host`), a `me` agent (`host + 1`), and me's peer for the target,
/// asserted to route over fabric.
pub fn fabric_pair(host: u128) -> (Agent, Agent, Peer) {
    let target = fabric_agent("target", host);
    let me = fabric_agent("me", host + 1);
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let route = peer.route();
    assert_eq!(route.transport, Path::Fabric, "{}", route.reason);
    (target, me, peer)
}

pub fn fabric_agent(name: &str, host: u128) -> Agent {
    Agent::new(AgentConfig {
        host_id: Some(host),
        transports: Transports {
            tcp: true,
            shm: true,
            rdma: false,
            fabric: true,
        },
        // The RDMA VM suite runs the fabric tests over the verbs provider on Soft-RoCE.
        fabric_provider: fabric_test_provider(),
        ..config(name, true)
    })
    .expect("agent")
}

/// `GDX_TEST_FABRIC_PROVIDER` (the RDMA VM suite sets `verbs`), else automatic, which is tcp
/// on 127.0.0.1 on a machine without an RDMA device.
pub fn fabric_test_provider() -> Option<String> {
    std::env::var("GDX_TEST_FABRIC_PROVIDER").ok()
}
