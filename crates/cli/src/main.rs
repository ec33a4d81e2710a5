//! The `gdx` binary: argument parsing and rendering only. Every decision lives in the library
//! crates (`gdx-topo`, `gdx-doctor`, `gdx-engine`); this file turns their data into text and
//! exit codes.
//!
//! Exit codes: 0 success, 1 a check or transfer failed, 2 gdx itself could not run (bad flags,
//! unreadable input, missing root). Errors are printed once, as `gdx: error: ...`.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// gdx: which GPU-direct data paths really work on this machine, and how fast.
///
/// `gdx topo` shows GPUs, NICs, PCIe switches, NUMA nodes and the path class between every
/// pair (the `nvidia-smi topo -m` legend), from the live machine, a captured machine or an
/// NCCL topology file. `gdx doctor` checks every known GPUDirect P2P/RDMA/Storage
/// prerequisite, with evidence and a fix, and proves paths with active probes.
#[derive(Parser, Debug)]
#[command(name = "gdx", version, about, long_about = None, propagate_version = true)]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(args) => cmd::topo::run(&args),
        Command::Doctor(args) => cmd::doctor::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Calibrate(args) => cmd::calibrate::run(&args),
        Command::Cp(args) => cmd::cp::run(&args),
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
            eprintln!("gdx: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
