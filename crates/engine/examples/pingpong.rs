//! Move a buffer between two processes, with notifications both ways.
//!
//! ```text
//! cargo run -p gdx-engine --example pingpong              # spawns its own server process
//! cargo run -p gdx-engine --example pingpong -- serve     # terminal 1: prints its address
//! cargo run -p gdx-engine --example pingpong -- 127.0.0.1:PORT   # terminal 2
//! ```
//!
//! Both processes must hold one secret: the spawning form writes a fresh one (mode 600) and hands
//! it to its child; with two terminals, give both `GDX_SECRET_FILE=<file>`.
//!
//! The client writes 16 MiB into the server's published region "inbox" and attaches the notification
//! "ping". The server, on "ping", inverts the bytes in place, connects back to the client (whose
//! listen address came in the handshake) and notifies "pong". The client then reads the region back
//! and checks every byte. Both sides print which path each transfer took. `GDX_TRANSPORTS=tcp`
//! forces tcp; by default two processes on one host use shm.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

use gdx_engine::{Access, Agent, AgentConfig, Error, Secret, Transfer};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const LEN: u64 = 16 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Error> {
    match std::env::args().nth(1).as_deref() {
        Some("serve") => serve(),
        Some(addr) => client(addr, None),
        None => {
            // Run the server as a child process and talk to it, with a secret made for both.
            let secret = Secret::generate()?;
            let file =
                std::env::temp_dir().join(format!("gdx-pingpong-{}.secret", std::process::id()));
            secret.write_file(&file)?;
            let exe = std::env::current_exe().map_err(|e| Error::os("current_exe", e))?;
            let mut child = Command::new(exe)
                .arg("serve")
                .env("GDX_SECRET_FILE", &file)
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| Error::os("spawn", e))?;
            let out = child
                .stdout
                .take()
                .ok_or_else(|| Error::unavailable(None, "child stdout"))?;
            let mut addr = String::new();
            BufReader::new(out)
                .read_line(&mut addr)
                .map_err(|e| Error::os("read", e))?;
            let addr = addr.trim().trim_start_matches("listening on ").to_string();
            let r = client(&addr, Some(secret));
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&file);
            r
        }
    }
}

fn serve() -> Result<(), Error> {
    let agent = Agent::new(AgentConfig {
        name: "pingpong-server".into(),
        ..AgentConfig::from_env()?
    })?;
    let mut inbox = agent.alloc(LEN, Access::READ_WRITE, Some("inbox"))?;
    println!("listening on {}", agent.listen_addr().expect("listening"));
    let client = agent.accept(Duration::from_secs(600))?;
    eprintln!("server: {} connected", client.name);
    let note = agent.wait_notification(Duration::from_secs(600))?;
    eprintln!(
        "server: notification {:?} from {}",
        String::from_utf8_lossy(&note.data),
        note.from
    );
    for b in inbox.bytes_mut()?.iter_mut() {
        *b = !*b;
    }
    let back = agent.connect(
        client
            .listen
            .as_deref()
            .ok_or_else(|| Error::unavailable(None, "client does not listen"))?,
    )?;
    back.notify("pong")?;
    std::thread::sleep(Duration::from_secs(1)); // let the client read before we exit
    Ok(())
}

fn client(addr: &str, secret: Option<Secret>) -> Result<(), Error> {
    let base = AgentConfig::from_env()?;
    let agent = Agent::new(AgentConfig {
        name: "pingpong-client".into(),
        secret: secret.or(base.secret.clone()),
        ..base
    })?;
    let peer = agent.connect(addr)?;
    println!(
        "connected to {:?}: {}",
        peer.info().name,
        peer.route().reason
    );
    let inbox = peer.region("inbox")?;

    let mut src = agent.alloc(LEN, Access::LOCAL, None)?;
    gdx_base::pattern::fill_pattern(&mut src.bytes_mut()?, 31);
    let mut t = Transfer::new();
    t.write(&src, 0, &inbox, 0, LEN).notify("ping");
    let rep = peer.submit(t)?.wait(WAIT)?;
    println!(
        "write: {} bytes in {:?} via {}",
        rep.bytes, rep.elapsed, rep.ops[0].plan
    );

    let pong = agent.wait_notification(WAIT)?;
    println!(
        "got {:?} from {}",
        String::from_utf8_lossy(&pong.data),
        pong.from
    );

    let dst = agent.alloc(LEN, Access::LOCAL, None)?;
    let mut t = Transfer::new();
    t.read(&dst, 0, &inbox, 0, LEN);
    let rep = peer.submit(t)?.wait(WAIT)?;
    println!(
        "read:  {} bytes in {:?} via {}",
        rep.bytes, rep.elapsed, rep.ops[0].plan
    );
    let ok = dst
        .bytes()?
        .iter()
        .zip(src.bytes()?.iter())
        .all(|(d, s)| *d == !*s);
    println!(
        "{}",
        if ok {
            "verified: every byte came back inverted"
        } else {
            "MISMATCH"
        }
    );
    if ok {
        Ok(())
    } else {
        Err(Error::Protocol("data mismatch".into()))
    }
}
