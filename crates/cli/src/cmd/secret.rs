//! `gdx secret`: a random secret for agents to share (32 random hex digits of 256 bits each
//! time), printed or written to a file of mode 600.

use anyhow::{bail, Context, Result};
use clap::Args;
use gdx_engine::Secret;
use std::path::PathBuf;
use std::process::ExitCode;

/// Make a random secret for `gdx serve --secret-file` and `GDX_SECRET_FILE`.
///
/// The secret is 64 random hex digits (256 bits). Peers prove they hold it with SPAKE2, so no
/// one can test guesses of it offline; a secret shorter than 16 bytes is refused everywhere.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx secret --out ~/.gdx-secret        written with mode 600 (refused if the file exists)
  umask 077; gdx secret > ~/.gdx-secret")]
pub struct SecretArgs {
    /// Write the secret to this file (created with mode 600; an existing file is refused, so
    /// a running cluster's secret is never overwritten by accident) instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn run(args: &SecretArgs) -> Result<ExitCode> {
    let s = Secret::generate().context("generating a secret")?;
    match &args.out {
        Some(f) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let name = gdx_topo::printable(&f.display().to_string());
            // O_EXCL: an existing file (or a symlink planted there) is never written through.
            let mut out = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(f)
            {
                Ok(o) => o,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    bail!("{name} exists; refusing to overwrite a secret (remove it first)")
                }
                Err(e) => return Err(e).with_context(|| format!("creating {name}")),
            };
            writeln!(out, "{}", s.reveal()).with_context(|| format!("writing {name}"))?;
            eprintln!(
                "gdx: wrote a new secret to {} (mode 600); give it to every peer as \
                 GDX_SECRET_FILE or --secret-file",
                name
            );
        }
        None => println!("{}", s.reveal()),
    }
    Ok(ExitCode::SUCCESS)
}
