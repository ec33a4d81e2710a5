//! Peer authentication: a shared secret, proved on the control connection with SPAKE2 (a
//! password-authenticated key exchange) and on every joining connection with an HMAC-SHA256
//! challenge–response under the session key that exchange made.
//!
//! The control connection starts with the initiator's `Hello`; the acceptor answers `Pake` (its
//! nonce and SPAKE2 message), the initiator answers `PakeAuth` (its SPAKE2 message and its key
//! confirmation), and only once that confirmation checks does the acceptor create a session and
//! answer `Hello`, whose identity tag is its own key confirmation. No message either side sends
//! can be tested against guessed secrets offline: a SPAKE2 message is a random-looking group
//! element, and a confirmation is keyed by a secret-dependent value the sender's peer can only
//! compute for the one guess it committed to in its own message (one online guess per
//! connection, each one logged and counted by the acceptor). Data streams and the shm socket
//! prove knowledge of the session key (a uniformly random 256-bit value, so an HMAC
//! challenge–response under it leaks nothing guessable), which binds them to the authenticated
//! session (the key never crosses the wire). The labels differ per role and per connection kind,
//! so no proof can be reflected or replayed elsewhere. See `docs/wire-protocol.md`.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;
use spake2::{Ed25519Group, Identity, Password, Spake2};

use crate::conn::Conn;
use crate::error::{AuthFailure, Error, Result};
use crate::wire::Msg;

/// An HMAC-SHA256 output.
pub(crate) type Mac = [u8; 32];

/// Shortest secret accepted (bytes). A PAKE stops offline guessing, not online guessing: a
/// secret this long (the 32 random hex digits of `gdx secret` hold 128 bits) survives any number
/// of logins an attacker can make, each of which the acceptor logs and counts.
pub const MIN_SECRET_BYTES: usize = 16;

/// A SPAKE2 message (Ed25519): a side byte and a compressed point.
pub(crate) type PakeMsg = [u8; 33];

/// The shared secret peers prove they hold. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<Vec<u8>>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

impl Secret {
    /// A secret from raw bytes (at least [`MIN_SECRET_BYTES`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when it is too short.
    pub fn from_bytes(b: impl Into<Vec<u8>>) -> Result<Secret> {
        let b = b.into();
        if b.len() < MIN_SECRET_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a secret needs at least {MIN_SECRET_BYTES} bytes, got {}; make one with \
                 `gdx secret > FILE` (32 random hex digits)",
                b.len()
            )));
        }
        Ok(Secret(Arc::new(b)))
    }

    /// Reads a secret file: its bytes, less trailing whitespace (so `echo` output works). The
    /// file must not be readable by group or others (`chmod 600`), as with ssh keys: a secret
    /// every local user can read authenticates every local user.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the file when it cannot be read, is too permissive or
    /// holds too short a secret.
    pub fn from_file(path: &Path) -> Result<Secret> {
        use std::os::unix::fs::PermissionsExt;
        let bad =
            |why: String| Error::InvalidArgument(format!("secret file {}: {why}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(bad(format!(
                "readable by group or others (mode {:o}); run chmod 600",
                meta.permissions().mode() & 0o777
            )));
        }
        if meta.len() > 4096 {
            return Err(bad("larger than 4096 bytes".into()));
        }
        let mut b = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        while b.last().is_some_and(|c| c.is_ascii_whitespace()) {
            b.pop();
        }
        Secret::from_bytes(b).map_err(|e| bad(e.to_string()))
    }

    /// A fresh random secret: 32 random bytes written as 64 hex digits (the text is the secret,
    /// so the operator can paste it into a file for peers).
    ///
    /// # Errors
    /// [`Error::Os`] if the kernel's random source fails.
    pub fn generate() -> Result<Secret> {
        let mut raw = [0u8; 32];
        crate::mem::random_bytes(&mut raw)?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Secret::from_bytes(hex.into_bytes())
    }

    /// Writes the secret to `path`, readable by this user only (mode 600), for another process
    /// to read with [`Secret::from_file`] / `GDX_SECRET_FILE`.
    ///
    /// # Errors
    /// [`Error::Os`] when the file cannot be written.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::os("open (secret file)", e))?;
        // An existing file keeps its mode on open: narrow it before the secret is in it.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::os("chmod (secret file)", e))?;
        f.write_all(&self.0)
            .map_err(|e| Error::os("write (secret file)", e))
    }

    /// The secret's text, for showing a generated secret to the operator once.
    pub fn reveal(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// The raw secret bytes (what the HMAC is keyed with). Handle with care: never log them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The secret shared by every agent of this process that was given none.
pub(crate) fn process_secret() -> Result<Secret> {
    static S: std::sync::OnceLock<Secret> = std::sync::OnceLock::new();
    if let Some(s) = S.get() {
        return Ok(s.clone());
    }
    let fresh = Secret::generate()?;
    Ok(S.get_or_init(|| fresh).clone())
}

/// HMAC-SHA256 of `label ‖ 0 ‖ parts…` under `key`.
pub(crate) fn mac(key: &[u8], label: &str, parts: &[&[u8]]) -> Mac {
    // new_from_slice accepts keys of any length for HMAC; the error arm cannot happen.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0u8; 32];
    };
    m.update(label.as_bytes());
    m.update(&[0]);
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Constant-time comparison of two MACs.
pub(crate) fn mac_eq(a: &Mac, b: &Mac) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key a control session derives from the exchange's key `k` for its data streams and shm
/// socket (and the acceptor's identity tag).
pub(crate) fn session_key(k: &Mac, ctx: &[u8], cn: u128, sn: u128) -> Mac {
    mac(
        k,
        "gdx/7 session key",
        &[ctx, &cn.to_le_bytes(), &sn.to_le_bytes()],
    )
}

/// SPAKE2's identities: the two roles, so neither side's message can be reflected back to it.
fn pake_ids() -> (Identity, Identity) {
    (
        Identity::new(b"gdx/7 initiator"),
        Identity::new(b"gdx/7 acceptor"),
    )
}

/// One side's SPAKE2 state, waiting for the other side's message.
pub(crate) struct Pake {
    state: Spake2<Ed25519Group>,
    /// This side's message, for the peer.
    pub(crate) msg: PakeMsg,
}

impl Pake {
    /// Starts the exchange as the initiator (`initiator`) or the acceptor, from the secret.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the library's message has an unexpected length (a version skew).
    pub(crate) fn start(secret: &Secret, initiator: bool) -> Result<Pake> {
        let (a, b) = pake_ids();
        let pw = Password::new(secret.bytes());
        let (state, msg) = if initiator {
            Spake2::<Ed25519Group>::start_a(&pw, &a, &b)
        } else {
            Spake2::<Ed25519Group>::start_b(&pw, &a, &b)
        };
        let msg = msg.try_into().map_err(|m: Vec<u8>| {
            Error::Protocol(format!("SPAKE2 message of {} bytes", m.len()))
        })?;
        Ok(Pake { state, msg })
    }

    /// Finishes with the peer's message: the shared key, equal on both sides only when both
    /// hold the same secret (nothing here says whether they do; the confirmations do).
    ///
    /// # Errors
    /// [`Error::AuthFailed`] when the peer's message is not a valid one for its role.
    pub(crate) fn finish(self, theirs: &PakeMsg, what: &str) -> Result<Mac> {
        let k = self.state.finish(theirs).map_err(|e| {
            Error::auth(
                AuthFailure::Proof,
                format!("{what}: the peer's SPAKE2 message is invalid ({e})"),
            )
        })?;
        k.try_into()
            .map_err(|k: Vec<u8>| Error::Protocol(format!("SPAKE2 key of {} bytes", k.len())))
    }
}

/// The initiator's key confirmation on the control connection: it holds the exchange's key.
pub(crate) fn control_confirm(k: &Mac, ctx: &[u8], cn: u128, sn: u128) -> Mac {
    mac(
        k,
        "gdx/7 control initiator",
        &[ctx, &cn.to_le_bytes(), &sn.to_le_bytes()],
    )
}

/// The acceptor's half of the control exchange: sends `Pake` (its nonce and SPAKE2 message),
/// then checks the initiator's `PakeAuth`. Returns the session key; the acceptor's own key
/// confirmation is the identity tag of its `Hello` (`session::identity_tag`), sent only after
/// the initiator proved itself. `ctx` is the initiator's agent id (LE), `cn` its nonce.
pub(crate) fn accept_control(c: &mut Conn, secret: &Secret, ctx: &[u8], cn: u128) -> Result<Mac> {
    let sn = crate::mem::random_u128()?;
    let p = Pake::start(secret, false)?;
    c.send(&Msg::Pake {
        nonce: sn,
        msg: p.msg,
    })?;
    match c.recv_frame(false)? {
        (Msg::PakeAuth { msg, mac: m }, 0) => {
            let k = p.finish(&msg, "control")?;
            if mac_eq(&m, &control_confirm(&k, ctx, cn, sn)) {
                Ok(session_key(&k, ctx, cn, sn))
            } else {
                Err(Error::auth(
                    AuthFailure::Proof,
                    "control: the initiator's key confirmation is wrong (it holds a different \
                     secret)",
                ))
            }
        }
        (m, _) => Err(Error::auth(
            AuthFailure::Sequence,
            format!("control: expected PakeAuth, got frame type {}", m.kind()),
        )),
    }
}

/// The initiator's half, once the acceptor's `Pake` arrived: finishes the exchange and sends
/// `PakeAuth` (its message and key confirmation). Returns the session key, which the
/// acceptor's identity tag must then prove (`peer::identity::check`).
pub(crate) fn answer_control(
    c: &mut Conn,
    secret: &Secret,
    ctx: &[u8],
    cn: u128,
    (sn, theirs): (u128, PakeMsg),
) -> Result<Mac> {
    let p = Pake::start(secret, true)?;
    let mine = p.msg;
    let k = p.finish(&theirs, "control")?;
    c.send(&Msg::PakeAuth {
        msg: mine,
        mac: control_confirm(&k, ctx, cn, sn),
    })?;
    Ok(session_key(&k, ctx, cn, sn))
}

/// The acceptor's half: sends `Challenge` (fresh nonce, proof under `key`), then checks the
/// initiator's `Auth`. Returns the acceptor's nonce. `what` names the connection kind
/// ("control", "join", "shm") and is part of every proof.
pub(crate) fn accept(c: &mut Conn, key: &[u8], what: &str, ctx: &[u8], cn: u128) -> Result<u128> {
    let sn = crate::mem::random_u128()?;
    let t = [ctx, &cn.to_le_bytes()[..], &sn.to_le_bytes()[..]];
    c.send(&Msg::Challenge {
        nonce: sn,
        mac: mac(key, &format!("gdx/3 {what} acceptor"), &t),
    })?;
    match c.recv_frame(false)? {
        (Msg::Auth { mac: m }, 0) => {
            if mac_eq(&m, &mac(key, &format!("gdx/3 {what} initiator"), &t)) {
                Ok(sn)
            } else {
                Err(Error::auth(
                    AuthFailure::Proof,
                    format!(
                    "{what}: the initiator's proof is wrong (it does not hold this agent's secret)"
                ),
                ))
            }
        }
        (m, _) => Err(Error::auth(
            AuthFailure::Sequence,
            format!("{what}: expected Auth, got frame type {}", m.kind()),
        )),
    }
}

/// The initiator's half, once the acceptor's `Challenge` arrived: checks its proof (so a peer
/// that does not hold the secret is never answered), then sends `Auth`.
pub(crate) fn answer(
    c: &mut Conn,
    key: &[u8],
    what: &str,
    ctx: &[u8],
    cn: u128,
    (sn, their): (u128, Mac),
) -> Result<()> {
    let t = [ctx, &cn.to_le_bytes()[..], &sn.to_le_bytes()[..]];
    if !mac_eq(&their, &mac(key, &format!("gdx/3 {what} acceptor"), &t)) {
        return Err(Error::auth(
            AuthFailure::Proof,
            format!(
                "{what}: the peer's proof is wrong (it holds a different secret: check \
             GDX_SECRET_FILE / --secret-file on both sides)"
            ),
        ));
    }
    c.send(&Msg::Auth {
        mac: mac(key, &format!("gdx/3 {what} initiator"), &t),
    })
}

/// The initiator's side of a joined connection (data stream, shm socket): waits for the
/// acceptor's `Challenge` after the join frame, answers it, and expects `Ok`.
pub(crate) fn join(c: &mut Conn, key: &[u8], what: &str, ctx: &[u8], cn: u128) -> Result<()> {
    match c.recv_frame(false)? {
        (Msg::Challenge { nonce, mac }, 0) => answer(c, key, what, ctx, cn, (nonce, mac))?,
        (Msg::Err(e), _) => return Err(e),
        (m, _) => {
            return Err(Error::Protocol(format!(
                "{what}: expected Challenge, got frame type {}",
                m.kind()
            )))
        }
    }
    match c.recv_frame(false)? {
        (Msg::Ok, 0) => Ok(()),
        (Msg::Err(e), _) => Err(e),
        (m, _) => Err(Error::Protocol(format!(
            "{what}: expected Ok, got frame type {}",
            m.kind()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_separate_roles() {
        let k = b"0123456789abcdef";
        let a = mac(k, "gdx/3 control acceptor", &[b"x"]);
        let b = mac(k, "gdx/3 control initiator", &[b"x"]);
        assert!(!mac_eq(&a, &b));
        assert!(mac_eq(&a, &mac(k, "gdx/3 control acceptor", &[b"x"])));
        assert!(!mac_eq(
            &a,
            &mac(b"0123456789abcdeg", "gdx/3 control acceptor", &[b"x"])
        ));
    }

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?". Our framing
        // adds label ‖ 0, so feed the data as label minus its last byte... instead check the
        // primitive directly.
        let mut m = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap_or_else(|_| unreachable!());
        m.update(b"what do ya want for nothing?");
        let out: Mac = m.finalize().into_bytes().into();
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn pake_agrees_only_on_the_same_secret() {
        let s = Secret::from_bytes(b"0123456789abcdef".to_vec()).unwrap_or_else(|e| panic!("{e}"));
        let t = Secret::from_bytes(b"0123456789abcdeg".to_vec()).unwrap_or_else(|e| panic!("{e}"));
        let run = |x: &Secret, y: &Secret| {
            let a = Pake::start(x, true).unwrap_or_else(|e| panic!("{e}"));
            let b = Pake::start(y, false).unwrap_or_else(|e| panic!("{e}"));
            let (am, bm) = (a.msg, b.msg);
            let ka = a.finish(&bm, "t").unwrap_or_else(|e| panic!("{e}"));
            let kb = b.finish(&am, "t").unwrap_or_else(|e| panic!("{e}"));
            (ka, kb)
        };
        let (ka, kb) = run(&s, &s);
        assert!(mac_eq(&ka, &kb));
        let (ka, kb) = run(&s, &t);
        assert!(!mac_eq(&ka, &kb));
        // Two runs with one secret make different keys (fresh scalars each time).
        assert!(!mac_eq(&run(&s, &s).0, &ka));
        // A message reflected back (the initiator's own) is not accepted as the acceptor's.
        let a = Pake::start(&s, true).unwrap_or_else(|e| panic!("{e}"));
        let own = a.msg;
        assert!(a.finish(&own, "t").is_err());
    }

    #[test]
    fn secret_rules() {
        assert!(Secret::from_bytes(b"short".to_vec()).is_err());
        let g = Secret::generate().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.reveal().len(), 64);
        assert!(!format!("{g:?}").contains(&g.reveal()));
        let dir = std::env::temp_dir().join(format!("gdx-secret-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let f = dir.join("s");
        g.write_file(&f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Secret::from_file(&f).ok(), Some(g.clone()));
        std::fs::write(&f, format!("{}\n", g.reveal())).unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644))
            .unwrap_or_else(|e| panic!("{e}"));
        let e = Secret::from_file(&f).expect_err("a world-readable secret file is refused");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Secret::from_file(&f).ok(), Some(g));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
