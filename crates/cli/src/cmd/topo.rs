//! `gdx topo`: the machine's GPUs, NICs, switches and NUMA nodes, and the path class between
//! every pair of GPUs and NICs, rendered like `nvidia-smi topo -m` plus a device list. The
//! report and the JSON view are built by `gdx_topo::render`; this file maps flags and prints.

use anyhow::{bail, Context, Result};
use clap::Args;
use gdx_topo::render::{self, RenderOptions};
use gdx_topo::Topology;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

/// Show the topology: GPUs, NICs, PCIe switches, NUMA nodes and the path class between every
/// pair (X, NV#, PIX, PXB, PHB, NODE, SYS).
///
/// Reads the live machine (sysfs + NVML) by default, a captured machine with --root, or an
/// NCCL topology file with --xml.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx topo                              the live machine
  gdx topo --json                       machine-readable (devices + matrix)
  gdx topo --p2p                        NVML's P2P status per GPU pair (nvidia-smi topo -p2p r)
  gdx topo --nic-map                    per GPU, the NICs to use and NCCL/UCX/NIXL/Mooncake settings
  eval \"$(gdx topo --nic-map)\"         export them for GPU $GDX_NIC_MAP_GPU (else $LOCAL_RANK, else 0)
  gdx topo --all-nics                   every NIC in the matrix, not only RDMA ones
  gdx topo --capture box.tar.gz         save this machine's sysfs/proc files for analysis elsewhere
  gdx topo --root box.tar.gz            analyse a captured machine (folder or .tar.gz)
  gdx topo --xml nccl-topo.xml          read an NCCL_TOPO_FILE
  gdx topo --export-xml topo.xml        write this machine as an NCCL_TOPO_FILE (e.g. inside a VM)")]
pub struct TopoArgs {
    /// Read sysfs/proc under DIR (a folder or a .tar.gz from --capture) instead of `/`.
    /// NVML is not used: its facts come from the capture's gdx/nvml.json, if any.
    #[arg(long, value_name = "DIR", conflicts_with = "xml")]
    root: Option<PathBuf>,

    /// Build the model from an NCCL topology XML file (NCCL_TOPO_FILE format): a regular file
    /// of at most 16 MiB.
    #[arg(long, value_name = "FILE")]
    xml: Option<PathBuf>,

    /// Print JSON: {"schema_version":1,"devices":[...],"matrix":{...},...} (labels GPU0..,
    /// NIC0..); with --p2p, {"schema_version":1,"p2p":{...}}.
    #[arg(long)]
    json: bool,

    /// Show NVML's P2P read status between every pair of GPUs instead of the path classes
    /// (like `nvidia-smi topo -p2p r`). Needs NVML: the live machine, or a capture that holds
    /// its facts.
    #[arg(long, conflicts_with_all = ["export_xml", "capture"])]
    p2p: bool,

    /// Per GPU and NUMA node, the NICs to use (path class, then speed; software RDMA last)
    /// and the matching NCCL_IB_HCA, UCX_NET_DEVICES, Mooncake MC_MS_FILTERS and
    /// nic_priority_matrix, as shell lines (a `case` on $GDX_NIC_MAP_GPU, else $LOCAL_RANK)
    /// or, with --json, {"schema_version":1,"gpus":[...],"numa":[...],...}.
    #[arg(long, conflicts_with_all = ["p2p", "export_xml", "capture", "all_nics"])]
    nic_map: bool,

    /// Put every NIC in the matrix. By default it shows the RDMA-capable ones, as nvidia-smi
    /// does (every NIC of an NCCL file); the device table always lists all.
    #[arg(long)]
    all_nics: bool,

    /// Colour: auto (only on a terminal, and not with NO_COLOR), always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,

    /// No messages on stderr (what was captured or written); results and errors still print.
    #[arg(long, short)]
    quiet: bool,

    /// Write the model as NCCL topology XML to FILE (`-` for stdout) instead of the report.
    #[arg(long, value_name = "FILE")]
    export_xml: Option<PathBuf>,

    /// Save the sysfs/proc files gdx reads, NVML facts and this shell's NCCL_*/GDX_*/CUDA_*
    /// variables (values of *SECRET*/*TOKEN*/*PASSWORD*/*KEY* names left out) into OUT, a
    /// folder or a .tar.gz, for `gdx topo --root OUT` / `gdx doctor --root OUT` elsewhere.
    #[arg(long, value_name = "OUT", conflicts_with_all = ["xml", "json", "export_xml"])]
    capture: Option<PathBuf>,
}

/// Load the topology the flags ask for.
pub fn load(root: Option<&PathBuf>, xml: Option<&PathBuf>) -> Result<Topology> {
    if let Some(x) = xml {
        // The error names the file and says it is read as NCCL XML.
        return gdx_topo::from_nccl_xml(x).map_err(Into::into);
    }
    match root {
        Some(r) => gdx_topo::from_root(r).map_err(Into::into),
        None => gdx_topo::discover().context("reading the live machine under /"),
    }
}

/// Whether to colour: `always`, `never`, or `auto` (a terminal and no `NO_COLOR`).
pub fn use_color(when: &str) -> bool {
    match when {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    }
}

/// Run `gdx topo`.
pub fn run(args: &TopoArgs) -> Result<ExitCode> {
    validate(args)?;
    remove_unpacked_on_signal(args.root.as_deref())?;
    // A .tar.gz capture is packed from a temporary folder: remove that on a signal too.
    remove_unpacked_on_signal(args.capture.as_deref())?;
    if let Some(out) = &args.capture {
        let root = args.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        let summary = gdx_topo::capture(&root, out)
            .with_context(|| format!("capturing {} into {}", root.display(), out.display()))?;
        if !args.quiet {
            eprintln!(
                "gdx: captured {} files into {}{}",
                summary.files,
                summary.out.display(),
                if summary.skipped.is_empty() {
                    String::new()
                } else {
                    format!(" ({} unreadable, skipped)", summary.skipped.len())
                }
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let topo = load(args.root.as_ref(), args.xml.as_ref())?;
    let mut stdout = std::io::stdout().lock();
    if let Some(dest) = &args.export_xml {
        let xml = gdx_topo::to_nccl_xml(&topo);
        if dest.as_os_str() == "-" {
            stdout.write_all(xml.as_bytes())?;
        } else {
            std::fs::write(dest, xml).with_context(|| format!("writing {}", dest.display()))?;
            if !args.quiet {
                eprintln!("gdx: wrote NCCL topology to {}", dest.display());
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let color = use_color(&args.color);
    if args.p2p {
        let why = |e: gdx_topo::TopoError| {
            anyhow::anyhow!(
                "--p2p: {e} (the path classes without P2P status: `gdx topo` without --p2p)"
            )
        };
        if args.json {
            let m = render::p2p_matrix(&topo).map_err(why)?;
            let v = serde_json::json!({"schema_version": render::SCHEMA_VERSION, "p2p": m});
            writeln!(stdout, "{}", super::output::json_pretty(&v)?)?;
        } else {
            let text = render::render_p2p(&topo, color).map_err(why)?;
            stdout.write_all(text.as_bytes())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.nic_map {
        let view = gdx_topo::nicmap::nic_map_view(&topo);
        if args.json {
            writeln!(stdout, "{}", super::output::json_pretty(&view)?)?;
        } else {
            let text = gdx_topo::nicmap::render_nic_map_shell(&topo, &view);
            stdout.write_all(text.as_bytes())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let opts = RenderOptions {
        all_nics: args.all_nics,
        color,
    };
    let fabric = nvmeof_controllers(args.root.as_deref(), args.xml.is_some())?;
    if args.json {
        let mut v = serde_json::to_value(render::json_view(&topo, &opts))?;
        v["nvmeof"] = gdx_topo::nvmeof::json(&fabric, &topo);
        let text = super::output::json_pretty(&v)?;
        writeln!(stdout, "{text}")?;
    } else {
        stdout.write_all(render::render_text(&topo, &opts).as_bytes())?;
        stdout.write_all(gdx_topo::nvmeof::render_text(&fabric, &topo).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The NVMe-oF controllers of the machine read (none for an NCCL XML file).
fn nvmeof_controllers(
    root: Option<&std::path::Path>,
    xml: bool,
) -> Result<Vec<gdx_topo::nvmeof::Controller>> {
    if xml {
        return Ok(Vec::new());
    }
    let root = root.unwrap_or(std::path::Path::new("/"));
    let opened =
        gdx_topo::sysfs::archive::open_root(root, gdx_topo::sysfs::archive::Require::Nothing)?;
    Ok(gdx_topo::nvmeof::controllers(
        &gdx_topo::sysfs::RootFs::new(opened.dir()),
    ))
}

/// An archive root is unpacked to a temporary folder: remove it on Ctrl-C / SIGTERM too. Only
/// for archives, which are read without starting other programs (see the function's docs).
pub fn remove_unpacked_on_signal(root: Option<&std::path::Path>) -> Result<()> {
    if root.is_some_and(gdx_topo::sysfs::archive::is_tarball_name) {
        gdx_topo::sysfs::archive::remove_unpacked_on_signal()
            .context("arranging to remove the unpacked archive on SIGINT/SIGTERM")?;
    }
    Ok(())
}

/// Refuse flags that make no sense together in ways clap cannot express.
pub fn validate(args: &TopoArgs) -> Result<()> {
    if args.json && args.export_xml.is_some() {
        bail!("--json and --export-xml both choose the output; pick one");
    }
    Ok(())
}
