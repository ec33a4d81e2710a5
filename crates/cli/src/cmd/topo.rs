//! `gdx topo`: the machine's GPUs, NICs, switches and NUMA nodes, and the path class between
//! every pair of GPUs and NICs, rendered like `nvidia-smi topo -m` plus a device list.

use anyhow::{bail, Context, Result};
use clap::Args;
use gdx_topo::{Device, DeviceKind, Link, LinkStatus, Source, Topology};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
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
  gdx topo --capture box.tar.gz         save this machine's sysfs/proc files for analysis elsewhere
  gdx topo --root box.tar.gz            analyse a captured machine (folder or .tar.gz)
  gdx topo --xml nccl-topo.xml          read an NCCL_TOPO_FILE
  gdx topo --export-xml topo.xml        write this machine as an NCCL_TOPO_FILE (e.g. inside a VM)")]
pub struct TopoArgs {
    /// Read sysfs/proc under DIR (a folder or a .tar.gz from --capture) instead of `/`.
    /// NVML is not used: its facts come from the capture's gdx/nvml.json, if any.
    #[arg(long, value_name = "DIR", conflicts_with = "xml")]
    root: Option<PathBuf>,

    /// Build the model from an NCCL topology XML file (NCCL_TOPO_FILE format).
    #[arg(long, value_name = "FILE")]
    xml: Option<PathBuf>,

    /// Print JSON: {"devices":[...],"matrix":{...}} (labels GPU0.., NIC0..).
    #[arg(long)]
    json: bool,

    /// Write the model as NCCL topology XML to FILE (`-` for stdout) instead of the report.
    #[arg(long, value_name = "FILE")]
    export_xml: Option<PathBuf>,

    /// Save the sysfs/proc files gdx reads (and NVML facts) into OUT, a folder or a
    /// .tar.gz, for `gdx topo --root OUT` / `gdx doctor --root OUT` elsewhere.
    #[arg(long, value_name = "OUT", conflicts_with_all = ["xml", "json", "export_xml"])]
    capture: Option<PathBuf>,
}

/// Load the topology the flags ask for.
pub fn load(root: Option<&PathBuf>, xml: Option<&PathBuf>) -> Result<Topology> {
    if let Some(x) = xml {
        return gdx_topo::from_nccl_xml(x).map_err(Into::into);
    }
    match root {
        Some(r) => gdx_topo::from_root(r).map_err(Into::into),
        None => gdx_topo::discover().context("reading the live machine under /"),
    }
}

/// Run `gdx topo`.
pub fn run(args: &TopoArgs) -> Result<ExitCode> {
    validate(args)?;
    remove_unpacked_on_signal(args.root.as_deref())?;
    if let Some(out) = &args.capture {
        let root = args.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        let summary = gdx_topo::capture(&root, out)
            .with_context(|| format!("capturing {} into {}", root.display(), out.display()))?;
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
            eprintln!("gdx: wrote NCCL topology to {}", dest.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        let text = serde_json::to_string_pretty(&json_view(&topo))?;
        writeln!(stdout, "{text}")?;
    } else {
        stdout.write_all(render(&topo).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--json` contract: `devices` (label, kind, bdf, name, numa, ...) and `matrix`
/// (label → label → class), plus where the model came from and the notes.
#[derive(Serialize)]
pub struct JsonView<'a> {
    source: &'a Source,
    devices: &'a [Device],
    matrix: BTreeMap<String, BTreeMap<String, String>>,
    numa_nodes: &'a [gdx_topo::NumaNode],
    switches: &'a [gdx_topo::Switch],
    nvml_enriched: bool,
    notes: &'a [String],
}

/// Build the JSON view of a topology.
pub fn json_view(topo: &Topology) -> JsonView<'_> {
    JsonView {
        source: &topo.source,
        devices: &topo.devices,
        matrix: topo
            .matrix()
            .into_iter()
            .map(|(k, row)| {
                (
                    k,
                    row.into_iter().map(|(c, v)| (c, v.to_string())).collect(),
                )
            })
            .collect(),
        numa_nodes: &topo.numa_nodes,
        switches: &topo.switches,
        nvml_enriched: topo.nvml_enriched,
        notes: &topo.notes,
    }
}

fn source_text(s: &Source) -> String {
    match s {
        Source::Sysfs(root) if root == "/" => "live machine (sysfs under /)".to_string(),
        Source::Sysfs(root) => format!("captured machine under {root}"),
        Source::NcclXml(p) => format!("NCCL topology file {p}"),
    }
}

fn link_text(l: &Link) -> String {
    match (l.generation(), l.speed_gts, l.width) {
        (Some(g), _, Some(w)) => format!("Gen{g} x{w}"),
        (None, Some(s), Some(w)) => format!("{s} GT/s x{w}"),
        (Some(g), _, None) => format!("Gen{g}"),
        (None, None, Some(w)) => format!("x{w}"),
        _ => "-".to_string(),
    }
}

fn link_status_text(l: &LinkStatus) -> String {
    let (c, m) = (link_text(&l.current), link_text(&l.max));
    if c == "-" && m == "-" {
        "-".into()
    } else {
        format!("{c} / {m}")
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "N/A".to_string(), T::to_string)
}

/// Pad every column of `rows` to its widest cell, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Render the human report: matrix, legend, device list, notes.
pub fn render(topo: &Topology) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Source: {}", source_text(&topo.source));
    let shown: Vec<&Device> = topo.gpus().chain(topo.nics()).collect();
    if shown.is_empty() {
        let _ = writeln!(
            out,
            "\nNo GPUs and no NICs found: nothing to connect. gdx looked for PCI display/accelerator \
             controllers (class 0x03xx/0x12xx) and network controllers (0x02xx, \
             /sys/class/infiniband, /sys/class/net)."
        );
    } else {
        if topo.gpus().next().is_none() {
            let _ = writeln!(
                out,
                "\nNo GPU found (no PCI display/accelerator controller of class 0x03xx/0x12xx): \
                 only NIC paths are shown."
            );
        }
        let matrix = topo.matrix();
        let mut rows = vec![{
            let mut h = vec![String::new()];
            h.extend(shown.iter().map(|d| d.label.clone()));
            h.extend(["CPU Affinity", "NUMA Affinity"].map(String::from));
            h
        }];
        for a in &shown {
            let mut r = vec![a.label.clone()];
            for b in &shown {
                r.push(
                    matrix
                        .get(&a.label)
                        .and_then(|row| row.get(&b.label))
                        .map_or_else(|| "?".into(), ToString::to_string),
                );
            }
            r.push(a.cpu_affinity.clone().unwrap_or_else(|| "N/A".into()));
            let numa = topo.numa_affinity(a);
            r.push(if numa.is_empty() {
                "N/A".to_string()
            } else {
                numa.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            });
            rows.push(r);
        }
        out.push('\n');
        out.push_str(&table(&rows));
        out.push_str("\nLegend:\n\n");
        for (k, m) in gdx_topo::legend() {
            let _ = writeln!(out, "  {k:<4} = {m}");
        }
        let nics: Vec<&Device> = topo.nics().collect();
        if !nics.is_empty() {
            out.push_str("\nNIC Legend:\n\n");
            for n in nics {
                let _ = writeln!(
                    out,
                    "  {}: {}",
                    n.label,
                    n.name.clone().unwrap_or_else(|| opt(&n.bdf))
                );
            }
        }
    }

    out.push_str("\nDevices:\n\n");
    let mut rows = vec![[
        "LABEL",
        "BDF",
        "NAME",
        "NUMA",
        "PCIe (cur / max)",
        "DETAILS",
    ]
    .map(String::from)
    .to_vec()];
    for d in &topo.devices {
        rows.push(vec![
            d.label.clone(),
            opt(&d.bdf),
            d.name.clone().unwrap_or_else(|| "-".into()),
            opt(&d.numa),
            link_status_text(&d.link),
            details(d),
        ]);
        if let Some(nic) = &d.nic {
            for p in &nic.ports {
                rows.push(vec![
                    String::new(),
                    format!("port {}", p.port),
                    p.state.clone().unwrap_or_else(|| "-".into()),
                    p.link_layer.clone().unwrap_or_else(|| "-".into()),
                    p.rate
                        .clone()
                        .unwrap_or_else(|| p.rate_gbps.map_or("-".into(), |r| format!("{r} Gb/s"))),
                    format!("{} GIDs", p.gids.len()),
                ]);
            }
        }
    }
    if topo.devices.is_empty() {
        out.push_str("  (none)\n");
    } else {
        out.push_str(&table(&rows));
    }
    if !topo.switches.is_empty() {
        let phys = topo.switches.iter().filter(|s| !s.is_virtual).count();
        let _ = writeln!(
            out,
            "\nPCIe switches: {} ({} virtual)",
            topo.switches.len(),
            topo.switches.len() - phys
        );
    }
    if !topo.numa_nodes.is_empty() {
        out.push_str("\nNUMA nodes:\n");
        for n in &topo.numa_nodes {
            let _ = writeln!(out, "  node{}: CPUs {}", n.id, n.cpus);
        }
    }
    if !topo.notes.is_empty() {
        out.push_str("\nNotes:\n");
        for n in &topo.notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    out
}

fn details(d: &Device) -> String {
    let mut parts: Vec<String> = Vec::new();
    match d.kind {
        DeviceKind::Gpu => {
            if let Some(g) = &d.gpu {
                if let Some(m) = g.memory_mib {
                    parts.push(format!("{m} MiB"));
                }
                if let Some(b) = g.bar1_mib {
                    parts.push(format!("BAR1 {b} MiB"));
                }
                let links: u32 = g.nvlinks.iter().map(|l| l.count).sum();
                if links > 0 {
                    parts.push(format!("{links} NVLinks"));
                }
            }
        }
        DeviceKind::Nic => {
            if let Some(n) = &d.nic {
                if !n.netdevs.is_empty() {
                    parts.push(n.netdevs.join(","));
                }
                if let Some(s) = n.speed_mbps {
                    parts.push(format!("{} Gb/s", s as f64 / 1000.0));
                }
            }
        }
        DeviceKind::Nvme => {}
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
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
