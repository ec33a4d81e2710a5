//! The topology as a reader sees it: the `nvidia-smi topo -m` style text report and the
//! `--json` view (both built here so the CLI only prints), and the `nvidia-smi topo -p2p r`
//! style P2P matrix from NVML's facts.
//!
//! One rule for both views: the matrix holds the GPUs and the NICs that can carry RDMA (what
//! `nvidia-smi` shows), or every NIC with [`RenderOptions::all_nics`]; NICs left out are
//! named in a note. The NUMA column is [`Topology::numa_affinity`] in the matrix and in the
//! device table alike. Names from the machine are shown through [`printable`].

use crate::error::NvmlGap;
use crate::model::{Device, DeviceKind, Link, LinkStatus, Source, Topology};
use crate::sysfs::archive::printable;
use crate::xml::NO_NVLINK_FACTS;
use crate::{PathClass, TopoError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Version of the `--json` layout; bumped on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// What the report shows and how.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// Every NIC in the matrix, not only the RDMA-capable ones.
    pub all_nics: bool,
    /// ANSI colours.
    pub color: bool,
}

/// True for NICs the matrix shows by default: RDMA devices (sysfs `infiniband` class), and
/// every NIC of an NCCL file (NCCL lists only the NICs it uses).
pub fn is_matrix_nic(topo: &Topology, d: &Device) -> bool {
    matches!(topo.source, Source::NcclXml(_))
        || d.nic
            .as_ref()
            .is_some_and(|n| n.rdma_name.is_some() || n.efa)
}

/// The devices of the matrix, GPUs first, then NICs (see [`is_matrix_nic`]).
pub fn matrix_devices<'a>(topo: &'a Topology, opts: &RenderOptions) -> Vec<&'a Device> {
    topo.gpus()
        .chain(
            topo.nics()
                .filter(|d| opts.all_nics || is_matrix_nic(topo, d)),
        )
        .collect()
}

/// NICs the matrix leaves out, as a note naming them and the flag that adds them.
fn left_out_note(topo: &Topology, opts: &RenderOptions) -> Option<String> {
    if opts.all_nics {
        return None;
    }
    let out: Vec<String> = topo
        .nics()
        .filter(|d| !is_matrix_nic(topo, d))
        .map(|d| format!("{} ({})", d.label, printable(&device_name(d))))
        .collect();
    (!out.is_empty()).then(|| {
        format!(
            "{} NIC{} without RDMA left out of the matrix: {} (--all-nics shows them)",
            out.len(),
            if out.len() == 1 { "" } else { "s" },
            out.join(", ")
        )
    })
}

/// Why the GPU↔GPU classes are PCIe only although the GPUs may be joined by NVLink: the
/// source has no NVLink facts at all. `None` with fewer than two GPUs or when it has some.
pub fn pcie_only_reason(topo: &Topology) -> Option<&'static str> {
    let gpus: Vec<&Device> = topo.gpus().collect();
    let any_links = gpus
        .iter()
        .any(|g| g.gpu.as_ref().is_some_and(|i| !i.nvlinks.is_empty()));
    if gpus.len() < 2 || topo.nvml_enriched || any_links {
        return None;
    }
    Some(match &topo.source {
        Source::NcclXml(_) => NO_NVLINK_FACTS,
        Source::Sysfs(r) if r == "/" => "PCIe only: NVML was not used, so NVLinks are unknown",
        Source::Sysfs(_) => {
            "PCIe only: the capture holds no NVML facts (gdx/nvml.json), so NVLinks are unknown"
        }
    })
}

/// The name a reader sees: the model's name, else the PCI address.
fn device_name(d: &Device) -> String {
    d.name
        .clone()
        .or_else(|| d.bdf.map(|b| b.to_string()))
        .unwrap_or_else(|| "-".into())
}

/// A NIC in the legend: its RDMA device or netdev (`mlx5_0`, `eth0`), as nvidia-smi shows
/// it; a NIC known by neither gets its PCI address beside the vendor name, to be findable.
fn legend_name(d: &Device) -> String {
    let named = d
        .nic
        .as_ref()
        .is_some_and(|n| n.rdma_name.is_some() || !n.netdevs.is_empty());
    match (named, &d.name, d.bdf) {
        (false, Some(name), Some(bdf)) => format!("{name} at {bdf}"),
        _ => device_name(d),
    }
}

/// The NUMA column, the same in the matrix and the device table.
pub fn numa_text(topo: &Topology, d: &Device) -> String {
    let numa = topo.numa_affinity(d);
    if numa.is_empty() {
        "N/A".to_string()
    } else {
        numa.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The `--json` contract: `schema_version`, where the model came from, `devices` (label, kind,
/// bdf, name, numa, ...), `matrix` (label → label → class over [`matrix_devices`]), the NICs
/// left out, why GPU↔GPU classes are PCIe only (when they are), and the notes.
#[derive(Debug, Serialize)]
pub struct JsonView<'a> {
    schema_version: u32,
    source: &'a Source,
    devices: &'a [Device],
    matrix: BTreeMap<String, BTreeMap<String, String>>,
    matrix_nics: &'static str,
    /// Label → NUMA nodes, as the text's NUMA columns show them (a device's own node, else
    /// the nodes its CPU affinity overlaps; `devices[].numa` stays the platform's raw answer).
    numa_affinity: BTreeMap<String, Vec<u32>>,
    gpu_gpu_classes: Option<&'static str>,
    numa_nodes: &'a [crate::NumaNode],
    switches: &'a [crate::Switch],
    nvml_enriched: bool,
    notes: Vec<String>,
}

/// Build the JSON view of a topology.
pub fn json_view<'a>(topo: &'a Topology, opts: &RenderOptions) -> JsonView<'a> {
    let devs = matrix_devices(topo, opts);
    let matrix = devs
        .iter()
        .map(|a| {
            let row = devs
                .iter()
                .map(|b| (b.label.clone(), topo.path_class(a, b).to_string()))
                .collect();
            (a.label.clone(), row)
        })
        .collect();
    let mut notes = topo.notes.clone();
    notes.extend(left_out_note(topo, opts));
    JsonView {
        schema_version: SCHEMA_VERSION,
        source: &topo.source,
        devices: &topo.devices,
        matrix,
        matrix_nics: if opts.all_nics { "all" } else { "rdma" },
        numa_affinity: topo
            .devices
            .iter()
            .map(|d| (d.label.clone(), topo.numa_affinity(d)))
            .collect(),
        gpu_gpu_classes: pcie_only_reason(topo),
        numa_nodes: &topo.numa_nodes,
        switches: &topo.switches,
        nvml_enriched: topo.nvml_enriched,
        notes,
    }
}

fn paint(s: &str, code: &str, on: bool) -> String {
    if on {
        format!("\x1b[{code}m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

/// Pad every column of `rows` to its widest cell, two spaces apart; `style` may colour a cell
/// (after padding, so colours do not shift the columns).
fn table(
    rows: &[Vec<String>],
    style: impl Fn(usize, usize, &str) -> Option<&'static str>,
    color: bool,
) -> String {
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
    for (ri, r) in rows.iter().enumerate() {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let padded = if c + 1 == r.len() {
                cell.clone()
            } else {
                format!("{cell:<w$}  ", w = widths[c])
            };
            match style(ri, c, cell) {
                Some(code) if color => {
                    let (text, pad) = padded.split_at(cell.len());
                    line.push_str(&paint(text, code, true));
                    line.push_str(pad);
                }
                _ => line.push_str(&padded),
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn source_text(s: &Source) -> String {
    match s {
        Source::Sysfs(root) if root == "/" => "live machine (sysfs under /)".to_string(),
        Source::Sysfs(root) => format!("captured machine under {}", printable(root)),
        Source::NcclXml(p) => format!("NCCL topology file {}", printable(p)),
    }
}

/// What to say when there is nothing (or no GPU) to connect, worded for the source.
fn nothing_to_connect(topo: &Topology, gpus: bool, nics: bool) -> Option<String> {
    let xml = matches!(topo.source, Source::NcclXml(_));
    match (gpus, nics, xml) {
        (true, _, _) => None,
        (false, false, true) => Some(
            "No GPUs and no NICs in this file: it has no <gpu> or <nic> elements and no <pci> \
             of a GPU (0x03xxxx) or network (0x02xxxx) class. Some vendor files (AWS p5, for \
             one) list only PCIe switches and bus ids, and NCCL adds the devices from the \
             machine itself; such a file says nothing about GPU paths on its own."
                .into(),
        ),
        (false, true, true) => Some(
            "No GPU in this file (no <gpu> element and no <pci> of class 0x03xxxx): only NIC \
             paths are shown; NCCL adds the GPUs from the machine itself."
                .into(),
        ),
        (false, false, false) => Some(
            "No GPUs and no NICs found: nothing to connect. gdx looked for PCI \
             display/accelerator controllers (class 0x03xx/0x12xx) and network controllers \
             (0x02xx, /sys/class/infiniband, /sys/class/net)."
                .into(),
        ),
        (false, true, false) => Some(
            "No GPU found (no PCI display/accelerator controller of class 0x03xx/0x12xx): only \
             NIC paths are shown."
                .into(),
        ),
    }
}

/// Render the human report: matrix, legend, device list, notes.
pub fn render_text(topo: &Topology, opts: &RenderOptions) -> String {
    let c = opts.color;
    let mut out = String::new();
    let _ = writeln!(out, "Source: {}", source_text(&topo.source));
    let shown = matrix_devices(topo, opts);
    let has_gpu = topo.gpus().next().is_some();
    if let Some(msg) = nothing_to_connect(topo, has_gpu, topo.nics().next().is_some()) {
        let _ = writeln!(out, "\n{msg}");
    }
    let pcie_only = pcie_only_reason(topo);
    if !shown.is_empty() {
        out.push('\n');
        out.push_str(&matrix_text(topo, &shown, pcie_only.is_some(), c));
        if let Some(why) = pcie_only {
            let _ = writeln!(out, "\n* GPU\u{2194}GPU: {why}");
        }
        out.push_str("\nLegend:\n\n");
        for (k, m) in crate::legend() {
            let _ = writeln!(out, "  {k:<4} = {m}");
        }
        let nics: Vec<&&Device> = shown.iter().filter(|d| d.kind == DeviceKind::Nic).collect();
        if !nics.is_empty() {
            out.push_str("\nNIC Legend:\n\n");
            for n in nics {
                let _ = writeln!(out, "  {}: {}", n.label, printable(&legend_name(n)));
            }
        }
    }
    devices_text(topo, &mut out, c);
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
            let cpus = if n.cpus.is_empty() {
                "none (memory only, or not in the source)"
            } else {
                &n.cpus
            };
            let _ = writeln!(out, "  node{}: CPUs {cpus}", n.id);
        }
    }
    let mut notes: Vec<String> = topo.notes.iter().map(|n| printable(n)).collect();
    notes.extend(left_out_note(topo, opts));
    if !notes.is_empty() {
        let _ = writeln!(out, "\n{}", paint("Notes:", "1", c));
        for n in &notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    out
}

fn class_color(cell: &str) -> Option<&'static str> {
    let class = cell.trim_end_matches('*');
    if class.starts_with("NV") {
        Some("32")
    } else if matches!(class, "PIX" | "PXB") {
        Some("36")
    } else if class == "SYS" {
        Some("33")
    } else {
        None
    }
}

fn matrix_text(topo: &Topology, shown: &[&Device], mark_pcie_only: bool, color: bool) -> String {
    let mut rows = vec![{
        let mut h = vec![String::new()];
        h.extend(shown.iter().map(|d| d.label.clone()));
        h.extend(["CPU Affinity", "NUMA Affinity"].map(String::from));
        h
    }];
    for a in shown {
        let mut r = vec![a.label.clone()];
        for b in shown {
            let class = topo.path_class(a, b);
            let gpu_pair = a.kind == DeviceKind::Gpu && b.kind == DeviceKind::Gpu;
            let mut cell = class.to_string();
            if mark_pcie_only && gpu_pair && class != PathClass::X {
                cell.push('*');
            }
            r.push(cell);
        }
        r.push(a.cpu_affinity.clone().unwrap_or_else(|| "N/A".into()));
        r.push(numa_text(topo, a));
        rows.push(r);
    }
    let n = shown.len();
    table(
        &rows,
        |ri, ci, cell| match (ri, ci) {
            (0, _) | (_, 0) => Some("1"),
            (_, c) if c <= n => class_color(cell),
            _ => None,
        },
        color,
    )
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

fn devices_text(topo: &Topology, out: &mut String, color: bool) {
    let _ = writeln!(out, "\n{}\n", paint("Devices:", "1", color));
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
            d.bdf.map_or_else(|| "N/A".into(), |b| b.to_string()),
            d.name.as_deref().map_or_else(|| "-".into(), printable),
            numa_text(topo, d),
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
        out.push_str(&table(&rows, |ri, _, _| (ri == 0).then_some("1"), color));
    }
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
                    parts.push(printable(&n.netdevs.join(",")));
                }
                if let Some(s) = n.speed_mbps {
                    parts.push(format!("{} Gb/s", s as f64 / 1000.0));
                }
                if n.software {
                    parts.push("software RDMA (no PCI device; the CPU moves the bytes)".into());
                }
                if n.efa {
                    parts.push("EFA (libfabric efa provider)".into());
                } else if n.rdma_name.is_none() {
                    parts.push("no RDMA".into());
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

/// The legend of the P2P matrix, as `nvidia-smi topo -p2p` prints it.
pub const P2P_LEGEND: [(&str, &str); 8] = [
    ("X", "Self"),
    ("OK", "Status Ok"),
    ("CNS", "Chipset not supported"),
    ("GNS", "GPU not supported"),
    ("TNS", "Topology not supported"),
    ("NS", "Not supported"),
    ("DI", "Disabled by regkey"),
    ("U", "Unknown"),
];

/// NVML's P2P read status between every pair of GPUs (label → label → `OK`/`NS`/...), or why
/// there is none: NVML was not used (no library, an NCCL file, a capture without its facts).
///
/// # Errors
/// [`TopoError::NoNvml`], saying why NVML's facts are not available.
pub fn p2p_matrix(
    topo: &Topology,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, TopoError> {
    if !topo.nvml_enriched {
        let why = match &topo.source {
            Source::NcclXml(_) => NvmlGap::NcclXml,
            Source::Sysfs(r) if r == "/" => NvmlGap::NotUsed {
                reason: topo
                    .notes
                    .iter()
                    .find_map(|n| n.strip_prefix("NVML not used: "))
                    .map(str::to_string),
            },
            Source::Sysfs(_) => NvmlGap::NotCaptured,
        };
        return Err(TopoError::NoNvml { why });
    }
    let gpus: Vec<&Device> = topo.gpus().collect();
    let mut m = BTreeMap::new();
    for a in &gpus {
        let status = a.gpu.as_ref().map(|g| &g.p2p_status);
        let mut row = BTreeMap::new();
        for b in &gpus {
            let cell = if a.label == b.label {
                "X".to_string()
            } else {
                status
                    .and_then(|s| s.iter().find(|(peer, _)| Some(*peer) == b.bdf))
                    .map_or_else(|| "U".to_string(), |(_, st)| printable(st))
            };
            row.insert(b.label.clone(), cell);
        }
        m.insert(a.label.clone(), row);
    }
    Ok(m)
}

/// The P2P matrix as text (rows and columns in GPU order) with its legend.
///
/// # Errors
/// As [`p2p_matrix`].
pub fn render_p2p(topo: &Topology, color: bool) -> Result<String, TopoError> {
    let m = p2p_matrix(topo)?;
    let labels: Vec<&str> = topo.gpus().map(|d| d.label.as_str()).collect();
    let mut out = String::new();
    let _ = writeln!(out, "Source: {}", source_text(&topo.source));
    if labels.is_empty() {
        let _ = writeln!(out, "\nNo GPU: no P2P matrix.");
        return Ok(out);
    }
    let _ = writeln!(
        out,
        "\nP2P read status (NVML, like `nvidia-smi topo -p2p r`):\n"
    );
    let mut rows = vec![std::iter::once(String::new())
        .chain(labels.iter().map(|l| l.to_string()))
        .collect::<Vec<_>>()];
    for a in &labels {
        let mut r = vec![a.to_string()];
        for b in &labels {
            r.push(
                m.get(*a)
                    .and_then(|row| row.get(*b))
                    .cloned()
                    .unwrap_or_else(|| "U".into()),
            );
        }
        rows.push(r);
    }
    out.push_str(&table(
        &rows,
        |ri, ci, cell| match (ri, ci, cell) {
            (0, _, _) | (_, 0, _) => Some("1"),
            (_, _, "OK") => Some("32"),
            (_, _, "X") => None,
            _ => Some("33"),
        },
        color,
    ));
    out.push_str("\nLegend:\n\n");
    for (k, v) in P2P_LEGEND {
        let _ = writeln!(out, "  {k:<4} = {v}");
    }
    Ok(out)
}
