//! The `gdx` binary: argument parsing and rendering only. Every decision lives in the library
//! crates (`gdx-topo`, `gdx-doctor`, `gdx-engine`); this file turns their data into text and
//! exit codes.
//!
//! Exit codes: 0 success, 1 a check or transfer failed, 2 gdx itself could not run (bad flags,
//! unreadable input, missing root). Errors are printed once, as `gdx: error: ...`.

mod cmd;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// `gdx --version`: the crate version, the git commit and the build date, so a bug report or a
/// BENCHMARKS.md row names exactly the build it came from (the bench header carries the same).
fn long_version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        format!(
            "{} (git {}, built {})",
            env!("CARGO_PKG_VERSION"),
            gdx_bench::header::GIT_HASH.unwrap_or("unknown: built outside a git checkout"),
            gdx_bench::header::BUILD_DATE.unwrap_or("unknown"),
        )
    })
}

/// gdx: which GPU-direct data paths really work on this machine, and how fast.
///
/// `gdx topo` shows GPUs, NICs, PCIe switches, NUMA nodes and the path class between every
/// pair (the `nvidia-smi topo -m` legend), from the live machine, a captured machine or an
/// NCCL topology file. `gdx doctor` checks every known GPUDirect P2P/RDMA/Storage
/// prerequisite, with evidence and a fix, and proves paths with active probes.
#[derive(Parser, Debug)]
#[command(name = "gdx", version = long_version(), about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Topo(cmd::topo::TopoArgs),
    Doctor(cmd::doctor::DoctorArgs),
    Serve(cmd::serve::ServeArgs),
    Bench(cmd::bench::BenchArgs),
    Calibrate(cmd::calibrate::CalibrateArgs),
    Cp(cmd::cp::CpArgs),
    Nccl(cmd::nccl::NcclArgs),
    Peers(cmd::peers::PeersArgs),
    Secret(cmd::secret::SecretArgs),
    Stream(cmd::stream::StreamArgs),
    Completions(CompletionsArgs),
}

/// Print a shell completion script.
///
///   gdx completions bash > ~/.local/share/bash-completion/completions/gdx
///   gdx completions zsh  > "${fpath[1]}/_gdx"
///   gdx completions fish > ~/.config/fish/completions/gdx.fish
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(args) => cmd::topo::run(&args),
        Command::Doctor(args) => cmd::doctor::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Calibrate(args) => cmd::calibrate::run(&args),
        // `gdx cp --bench` is `gdx bench` now: cp translates its flags, bench runs.
        Command::Cp(args) => match args.bench_alias() {
            Some(argv) => cmd::bench::run_argv(&argv),
            None => cmd::cp::run(&args),
        },
        Command::Nccl(args) => cmd::nccl::run(&args),
        Command::Peers(args) => cmd::peers::run(&args),
        Command::Secret(args) => cmd::secret::run(&args),
        Command::Stream(args) => cmd::stream::run(&args),
        Command::Completions(args) => {
            // Into a buffer first: clap_complete panics on a write error (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut Cli::command(), "gdx", &mut script);
            std::io::Write::write_all(&mut std::io::stdout().lock(), &script)
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`gdx topo | head`) is not an error worth reporting.
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            // Errors quote peers, logs and files: escaped before they reach the terminal.
            eprintln!(
                "gdx: error: {}",
                gdx_topo::printable_text(&cmd::output::error_chain(&err))
            );
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cmd::output::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("reading box.tar.gz: {0}")]
    struct Wraps(#[source] std::io::Error);

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let err = anyhow::Error::new(Wraps(io)).context("--root");
        let line = error_chain(&err);
        assert_eq!(line.matches(&text).count(), 1, "{line}");
        assert!(line.starts_with("--root: reading box.tar.gz: "), "{line}");
    }
}
