//! `--xml` input is bounded (regular files only, a size cap, caps on `<cpu>` and devices, no
//! quadratic building) and honest (a file without `<nvlink>` says its GPU↔GPU classes are
//! PCIe only; a file without GPUs gets an XML-worded message).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::render::{self, RenderOptions};
use gdx_topo::xml::{MAX_CPUS, MAX_DEVICES, MAX_XML_BYTES, NO_NVLINK_FACTS};
use gdx_topo::{from_nccl_xml, parse_nccl_xml, TopoError};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A shared reference file (the fixture's finder: it fails under CI when they are missing).
fn reference(name: &str) -> PathBuf {
    gdx_topo::fixture::reference_topologies().join(name)
}

fn input_error(p: &Path) -> String {
    match from_nccl_xml(p) {
        Err(e @ TopoError::XmlInput { .. }) => e.to_string(),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("{} was read", p.display()),
    }
}

#[test]
fn a_fifo_is_refused_without_being_opened() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("topo.xml");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    // Before, open() blocked here forever waiting for a writer.
    let e = input_error(&fifo);
    assert!(e.contains("a FIFO, not a regular file"), "{e}");
}

#[test]
fn a_device_and_a_folder_are_refused() {
    let e = input_error(Path::new("/dev/zero"));
    assert!(e.contains("a device, not a regular file"), "{e}");
    let d = tempfile::tempdir().unwrap();
    assert!(input_error(d.path()).contains("a folder"));
    let e = input_error(&d.path().join("missing.xml"));
    assert!(
        e.contains("no such file") && e.contains("NCCL_TOPO_FILE"),
        "{e}"
    );
}

#[test]
fn a_file_over_the_size_cap_is_refused_before_parsing() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("big.xml");
    // Valid XML (a comment) one byte over the cap: only the cap can refuse it.
    let mut text = String::from("<system version=\"1\"><!--");
    let fill = MAX_XML_BYTES as usize + 1 - text.len() - "--></system>".len();
    text.push_str(&"x".repeat(fill));
    text.push_str("--></system>");
    assert_eq!(text.len() as u64, MAX_XML_BYTES + 1);
    std::fs::write(&p, &text).unwrap();
    let e = input_error(&p);
    assert!(e.contains("larger than 16 MiB"), "{e}");
}

#[test]
fn too_many_cpu_elements_are_refused() {
    // 160k <cpu> elements (3.4 MB) took 48 s before.
    let mut x = String::from("<system version=\"1\">\n");
    for _ in 0..(MAX_CPUS * 4) {
        x.push_str("<cpu numaid=\"0\"/>\n");
    }
    x.push_str("</system>\n");
    let e = parse_nccl_xml(&x, Path::new("cpus.xml")).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("more than {MAX_CPUS} <cpu> elements")),
        "{msg}"
    );
    // The line of the first one past the cap.
    assert!(
        msg.starts_with(&format!("cpus.xml:{}:", MAX_CPUS + 2)),
        "{msg}"
    );
}

#[test]
fn too_many_devices_are_refused() {
    // 4000 GPUs (590 KB) took 2.2 GB before, for a matrix of 16 million cells.
    let mut x = String::from("<system version=\"1\"><cpu numaid=\"0\">\n");
    for i in 0..4000u32 {
        let _ = writeln!(
            x,
            "<pci busid=\"0000:{:02x}:{:02x}.0\" class=\"0x030200\"/>",
            i / 32,
            i % 32
        );
    }
    x.push_str("</cpu></system>\n");
    let msg = parse_nccl_xml(&x, Path::new("gpus.xml"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!("more than {MAX_DEVICES} devices")),
        "{msg}"
    );
}

#[test]
fn notes_are_capped_and_keep_their_line_numbers() {
    let mut x = String::from("<system version=\"1\">\n");
    for _ in 0..1000 {
        x.push_str("<cpu numaid=\"3\"/>\n");
    }
    x.push_str("</system>\n");
    let t = parse_nccl_xml(&x, Path::new("dup.xml")).unwrap();
    assert!(t.notes[0].contains("(line 3)"), "{}", t.notes[0]);
    assert!(t.notes.len() <= 202, "{} notes", t.notes.len());
    assert!(
        t.notes.iter().any(|n| n.contains("more notes like these")),
        "{:?}",
        t.notes.last()
    );
}

fn two_gpus(links: &str) -> String {
    format!(
        "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ff\">\
         <pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\" sm=\"90\">{links}</gpu></pci>\
         <pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu dev=\"1\" sm=\"90\"/></pci>\
         </cpu></system>"
    )
}

#[test]
fn a_file_without_nvlink_elements_says_its_gpu_classes_are_pcie_only() {
    let t = parse_nccl_xml(&two_gpus(""), Path::new("no-nv.xml")).unwrap();
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("no <nvlink> elements") && n.contains(NO_NVLINK_FACTS)),
        "{:?}",
        t.notes
    );
    assert_eq!(render::pcie_only_reason(&t), Some(NO_NVLINK_FACTS));
    let text = render::render_text(&t, &RenderOptions::default());
    assert!(text.contains("GPU0  X     PHB*"), "{text}");
    assert!(
        text.contains(&format!("* GPU\u{2194}GPU: {NO_NVLINK_FACTS}")),
        "{text}"
    );
    let v = serde_json::to_value(render::json_view(&t, &RenderOptions::default())).unwrap();
    assert_eq!(v["gpu_gpu_classes"], NO_NVLINK_FACTS);
    assert_eq!(v["schema_version"], 1);

    // With NVLink facts nothing is marked.
    let nv = two_gpus("<nvlink target=\"0000:02:00.0\" count=\"4\" tclass=\"0x030200\"/>");
    let t = parse_nccl_xml(&nv, Path::new("nv.xml")).unwrap();
    assert_eq!(render::pcie_only_reason(&t), None);
    assert!(!t.notes.iter().any(|n| n.contains("<nvlink>")));
    let text = render::render_text(&t, &RenderOptions::default());
    assert!(text.contains("GPU0  X     NV4"), "{text}");
    assert!(!text.contains('*'), "{text}");
}

#[test]
fn azure_ndv5_has_no_nvlink_facts_and_says_so() {
    let p = reference("nccl_topo_azure_ndv5-topo.xml");
    let t = from_nccl_xml(&p).unwrap();
    assert_eq!(t.gpus().count(), 8);
    assert_eq!(render::pcie_only_reason(&t), Some(NO_NVLINK_FACTS));
}

#[test]
fn a_file_without_gpus_gets_an_xml_worded_message() {
    let x = "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\">\
             <pci busid=\"0000:02:00.0\"/></pci></cpu></system>";
    let t = parse_nccl_xml(x, Path::new("p5.xml")).unwrap();
    let text = render::render_text(&t, &RenderOptions::default());
    assert!(text.contains("No GPUs and no NICs in this file"), "{text}");
    assert!(
        !text.contains("/sys/class"),
        "sysfs wording for XML input: {text}"
    );
}

#[test]
fn too_many_switches_nvlink_targets_or_nets_are_refused() {
    use gdx_topo::xml::{MAX_PER_DEVICE, MAX_SWITCHES};
    let mut x = String::from("<system version=\"1\"><cpu numaid=\"0\">\n");
    for i in 0..=MAX_SWITCHES as u32 {
        let _ = writeln!(
            x,
            "<pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x060400\"/>",
            i / 256,
            i % 256
        );
    }
    x.push_str("</cpu></system>\n");
    let msg = parse_nccl_xml(&x, Path::new("sw.xml"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!("more than {MAX_SWITCHES} PCIe switches")),
        "{msg}"
    );

    // Every GPU pair scans a GPU's NVLink targets: a GPU with thousands is refused.
    let mut links = String::new();
    for i in 0..=MAX_PER_DEVICE as u32 {
        let _ = write!(
            links,
            "<nvlink target=\"0001:{:02x}:{:02x}.0\" count=\"1\" tclass=\"0x030200\"/>",
            i / 32,
            i % 32
        );
    }
    let msg = parse_nccl_xml(&two_gpus(&links), Path::new("nv.xml"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!("more than {MAX_PER_DEVICE} targets")),
        "{msg}"
    );

    let mut nets = String::new();
    for i in 0..=MAX_PER_DEVICE {
        let _ = write!(nets, "<net name=\"mlx5_{i}\" dev=\"{i}\"/>");
    }
    let x = format!(
        "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\"><nic>{nets}</nic></pci></cpu></system>"
    );
    let msg = parse_nccl_xml(&x, Path::new("net.xml"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!("more than {MAX_PER_DEVICE} <net>")),
        "{msg}"
    );
}
