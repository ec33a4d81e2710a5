//! Bad NCCL topology input: malformed XML and misplaced or malformed NCCL elements give an
//! error that names the line; no input at all makes the parser (or the writer, given what
//! the parser accepted) panic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::{parse_nccl_xml, to_nccl_xml, PathClass, TopoError};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn reference_dir() -> PathBuf {
    gdx_topo::fixture::reference_topologies()
}

fn reference_texts() -> Vec<String> {
    let dir = reference_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn parse(text: &str) -> Result<gdx_topo::Topology, TopoError> {
    parse_nccl_xml(text, Path::new("t.xml"))
}

/// (line, column, message) of an Xml error; anything else fails the test.
fn xml_err(text: &str) -> (u32, u32, String) {
    match parse(text) {
        Err(TopoError::Xml {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        other => panic!("expected an Xml error, got {other:?}"),
    }
}

/// 1-based line of the first occurrence of `needle`.
fn line_of(text: &str, needle: &str) -> u32 {
    let at = text.find(needle).expect("needle in text");
    text[..at].lines().count() as u32 + u32::from(text[..at].ends_with('\n'))
}

const SMALL: &str = r#"<system version="1">
  <cpu numaid="0" affinity="0000ffff">
    <pci busid="ffff:ff:01.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90"/>
      </pci>
      <pci busid="0000:02:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16">
        <nic>
          <net name="mlx5_0" dev="0" speed="400000" port="1" gdr="1"/>
        </nic>
      </pci>
    </pci>
  </cpu>
</system>
"#;

#[test]
fn small_file_parses() {
    let t = parse(SMALL).unwrap();
    assert_eq!(t.class_between("GPU0", "NIC0"), Some(PathClass::Pix));
    let nic = t.device("NIC0").unwrap().nic.as_ref().unwrap();
    assert_eq!(nic.rdma_name.as_deref(), Some("mlx5_0"));
    assert!(nic.netdevs.is_empty());
    assert_eq!(nic.ports[0].port, 1);
    assert_eq!(nic.ports[0].rate_gbps, Some(400.0));
    assert_eq!(
        t.device("GPU0")
            .unwrap()
            .gpu
            .as_ref()
            .unwrap()
            .compute_capability
            .as_deref(),
        Some("9.0")
    );
    assert_eq!(t.numa_nodes[0].cpus, "0-15");
}

#[test]
fn truncated_file_names_the_last_line() {
    // Cut inside the NIC's tag, on line 7 of SMALL.
    let cut = SMALL.find("class=\"0x020700\"").unwrap();
    let text = &SMALL[..cut];
    let (line, _, message) = xml_err(text);
    assert_eq!(line, 7, "{message}");
    assert_eq!(line, line_of(SMALL, "class=\"0x020700\""));
    assert!(message.starts_with("malformed XML"), "{message}");
    // A file cut after a complete line: the open elements are never closed.
    let text: String = SMALL.lines().take(9).map(|l| format!("{l}\n")).collect();
    let (line, _, message) = xml_err(&text);
    assert!(line >= 9, "line {line}: {message}");
}

#[test]
fn truncated_reference_files_name_their_last_line() {
    for text in reference_texts() {
        let lines: Vec<&str> = text.lines().collect();
        let keep = lines.len() / 2;
        // Cut the middle line in two: whatever the line holds, the file is broken there.
        let mut cut: String = lines[..keep].iter().map(|l| format!("{l}\n")).collect();
        cut.push_str(&lines[keep][..lines[keep].len() / 2]);
        let err = parse(&cut).unwrap_err();
        match err {
            TopoError::Xml { line, .. } => {
                assert!(
                    line as usize >= keep && line as usize <= keep + 1,
                    "line {line}, cut at line {}: {err}",
                    keep + 1
                )
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn unknown_root_is_not_a_topology() {
    match parse("<foo><bar/></foo>") {
        Err(TopoError::NotATopology { why, .. }) => {
            assert!(why.contains("<foo>") && why.contains("<system>"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    match parse(r#"<graphs version="1"><graph id="0"/></graphs>"#) {
        Err(e @ TopoError::NotATopology { .. }) => {
            assert!(e.to_string().contains("NCCL_GRAPH_FILE"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_busid_names_line_and_attribute() {
    let text = SMALL.replace("0000:02:00.0", "0000:02:zz.0");
    let (line, column, message) = xml_err(&text);
    assert_eq!(line, line_of(&text, "0000:02:zz.0"));
    assert!(column > 1);
    assert!(
        message.contains("<pci busid=\"0000:02:zz.0\">"),
        "{message}"
    );
    assert!(message.contains("busid"), "{message}");
    let full = parse(&text).unwrap_err().to_string();
    assert!(full.starts_with(&format!("t.xml:{line}:")), "{full}");
}

#[test]
fn structural_errors_name_element_and_attribute() {
    // <gpu> directly under <cpu>.
    let text = "<system version=\"1\">\n<cpu numaid=\"0\">\n<gpu dev=\"0\"/>\n</cpu>\n</system>";
    let (line, _, message) = xml_err(text);
    assert_eq!(line, 3);
    assert!(
        message.contains("<gpu>") && message.contains("<cpu>"),
        "{message}"
    );

    let text = SMALL.replace("numaid=\"0\"", "numaid=\"zero\"");
    let (line, _, message) = xml_err(&text);
    assert_eq!(line, 2);
    assert!(message.contains("numaid=\"zero\""), "{message}");

    let text = SMALL.replace("<gpu dev=\"0\" sm=\"90\"/>", "<gpu dev=\"0\" sm=\"90\">\n<nvlink target=\"0000:03:00.0\" count=\"many\" tclass=\"0x030200\"/>\n</gpu>");
    let (line, _, message) = xml_err(&text);
    assert_eq!(line, line_of(&text, "<nvlink"));
    assert!(
        message.contains("<nvlink>") && message.contains("count=\"many\""),
        "{message}"
    );

    let text = SMALL.replace("class=\"0x030200\"", "class=\"GPU\"");
    let (_, _, message) = xml_err(&text);
    assert!(message.contains("class=\"GPU\""), "{message}");

    let text = SMALL.replace(
        "link_width=\"16\">\n        <gpu",
        "link_width=\"x16\">\n        <gpu",
    );
    let (line, _, message) = xml_err(&text);
    assert_eq!(line, 4);
    assert!(message.contains("link_width"), "{message}");

    let text = SMALL.replace(" busid=\"0000:01:00.0\"", "");
    let (line, _, message) = xml_err(&text);
    assert_eq!(line, 4);
    assert!(message.contains("missing busid"), "{message}");

    let (_, _, message) = xml_err("<system><cpu/></system>");
    assert!(message.contains("numaid"), "{message}");

    // Malformed affinity mask.
    let (_, _, message) = xml_err(r#"<system><cpu numaid="0" affinity="xyz"/></system>"#);
    assert!(message.contains("affinity"), "{message}");
}

#[test]
fn lenient_where_nccl_is() {
    // Unknown elements are noted, not fatal; numaid -1 means "NUMA node unknown".
    let text = r#"<system version="1"><cpu numaid="-1"><pci busid="0000:01:00.0" class="0x030200" link_speed="Unknown" link_width=""><gpu dev="0"/><pcilink target="0000:02:00.0"/></pci><pci busid="0000:02:00.0" class="0x030200"/><foo/></cpu></system>"#;
    let t = parse(text).unwrap();
    assert_eq!(t.devices.len(), 2);
    assert_eq!(t.devices[0].numa, None);
    assert_eq!(t.devices[0].attach.host_bridge.as_deref(), Some("cpu-1"));
    assert!(t.numa_nodes.is_empty());
    assert!(t.notes.iter().any(|n| n.contains("<foo>")), "{:?}", t.notes);
    assert_eq!(t.class_between("GPU0", "GPU1"), Some(PathClass::Phb));
    let xml = to_nccl_xml(&t);
    assert!(xml.contains("<cpu numaid=\"-1\""), "{xml}");
    assert_eq!(parse(&xml).unwrap().matrix(), t.matrix());
}

#[test]
fn nvswitch_and_cpu_links() {
    let text = r#"<system version="1"><cpu numaid="0">
<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="90">
<nvlink target="0000:c7:00.0" count="2" tclass="0x068000"/>
<nvlink target="0000:c8:00.0" count="2" tclass="0x068000"/>
<nvlink target="fffffff:ffff:ff" count="14"/>
<c2c bw="20" count="10"/>
</gpu></pci>
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="90">
<nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/>
</gpu></pci>
<pci busid="0000:03:00.0" class="0x030200"><gpu dev="2" sm="90">
<nvlink target="0000:03:00.0" count="18" tclass="0x030200"/>
</gpu></pci>
</cpu></system>"#;
    let t = parse(text).unwrap();
    let links = &t.device("GPU0").unwrap().gpu.as_ref().unwrap().nvlinks;
    assert_eq!(links.len(), 2, "{links:?}");
    assert_eq!(links[0].target, gdx_topo::NvLinkTarget::NvSwitch);
    assert_eq!(links[0].count, 18);
    assert_eq!(links[1].target, gdx_topo::NvLinkTarget::Cpu);
    assert_eq!(t.class_between("GPU0", "GPU1"), Some(PathClass::Nv(18)));
    assert_eq!(t.class_between("GPU0", "GPU2"), Some(PathClass::Phb));
    assert!(t
        .notes
        .iter()
        .any(|n| n.starts_with("GPU2 (0000:03:00.0): <nvlink target> is its own bus id")));
    let xml = to_nccl_xml(&t);
    assert!(
        xml.contains("<nvlink target=\"fffffff:ffff:ff\" count=\"18\" tclass=\"0x068000\"/>"),
        "{xml}"
    );
    let again = parse(&xml).unwrap();
    assert_eq!(again.matrix(), t.matrix());
    assert_eq!(again.devices[0].gpu, t.devices[0].gpu);
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let depth = 5000;
    let mut text = String::from("<system version=\"1\"><cpu numaid=\"0\">");
    for i in 0..depth {
        text.push_str(&format!("<pci busid=\"0000:{:02x}:00.0\">", i % 256));
    }
    for _ in 0..depth {
        text.push_str("</pci>");
    }
    text.push_str("</cpu></system>");
    let (_, _, message) = xml_err(&text);
    assert!(message.contains("nested"), "{message}");
}

/// One edit of a real file: cut it, drop a span, insert a snippet, overwrite a span (these
/// mostly break the XML), or, keeping it well-formed, give the n-th attribute another value
/// or drop the n-th line (most lines hold one self-closed element).
#[derive(Debug, Clone)]
enum Edit {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, String),
    Replace(usize, String),
    Value(usize, String),
    DropLine(usize),
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut t = text.as_bytes().to_vec();
    for e in edits {
        let len = t.len().max(1);
        match e {
            Edit::Truncate(at) => t.truncate(at % len),
            Edit::Delete(at, n) => {
                let a = at % len;
                let b = (a + n).min(t.len());
                if a < b {
                    t.drain(a..b);
                }
            }
            Edit::Insert(at, s) => {
                let a = (at % len).min(t.len());
                t.splice(a..a, s.bytes());
            }
            Edit::Replace(at, s) => {
                let a = (at % len).min(t.len());
                let b = (a + s.len()).min(t.len());
                t.splice(a..b, s.bytes());
            }
            Edit::Value(n, v) => {
                // Spans between the quotes of `="..."`.
                let starts: Vec<usize> = t
                    .windows(2)
                    .enumerate()
                    .filter(|(_, w)| w == b"=\"")
                    .map(|(i, _)| i + 2)
                    .collect();
                if starts.is_empty() {
                    continue;
                }
                let a = starts[n % starts.len()];
                let b = t[a..]
                    .iter()
                    .position(|&c| c == b'"')
                    .map_or(t.len(), |p| a + p);
                t.splice(a..b, v.bytes());
            }
            Edit::DropLine(n) => {
                let text = String::from_utf8_lossy(&t).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                let drop = n % lines.len().max(1);
                t = lines
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != drop)
                    .map(|(_, l)| format!("{l}\n"))
                    .collect::<String>()
                    .into_bytes();
            }
        }
    }
    // The files are ASCII and the snippets too, so this never loses anything.
    String::from_utf8_lossy(&t).into_owned()
}

/// XML-ish snippets: the characters and words that steer a parser into odd corners.
fn snippet() -> impl Strategy<Value = String> {
    prop_oneof![
        "[<>/=\" a-z0-9:.x,-]{1,12}",
        Just("<pci busid=\"0000:01:00.0\">".to_string()),
        Just("</pci>".to_string()),
        Just("<gpu dev=\"0\"/>".to_string()),
        Just("<nic><net name=\"mlx5_0\"/></nic>".to_string()),
        Just("<nvlink target=\"0000:01:00.0\" count=\"1\"/>".to_string()),
        Just("class=\"0x068000\"".to_string()),
        Just("numaid=\"-1\"".to_string()),
        Just("ffff:ff:ff.f".to_string()),
        Just("&amp;".to_string()),
        Just("<!--".to_string()),
        Just("-99999999999999999999".to_string()),
    ]
}

/// Attribute values: well-formed, often meaningful to NCCL, sometimes not.
fn value() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9a-fx:.,-]{0,12}", meaningful_value()]
}

/// Attribute values NCCL files really hold, so that edited files mostly still load.
fn meaningful_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("-1".to_string()),
        Just("0x030200".to_string()),
        Just("0x020700".to_string()),
        Just("0x060400".to_string()),
        Just("0x068000".to_string()),
        Just("0x068001".to_string()),
        Just("0000:01:00.0".to_string()),
        Just("0001:00:00.0".to_string()),
        Just("ffff:ff:01.0".to_string()),
        Just("fffffff:ffff:ff".to_string()),
        Just("16.0 GT/s PCIe".to_string()),
        Just("mlx5_0".to_string()),
        Just("ffffffff,ffffffff".to_string()),
    ]
}

/// Edits that keep the file well-formed and mostly loadable: what the round trip is
/// checked on.
fn tame_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), meaningful_value()).prop_map(|(n, v)| Edit::Value(n, v)),
        1 => any::<usize>().prop_map(Edit::DropLine),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), value()).prop_map(|(n, v)| Edit::Value(n, v)),
        1 => any::<usize>().prop_map(Edit::DropLine),
        1 => any::<usize>().prop_map(Edit::Truncate),
        1 => (any::<usize>(), 1usize..40).prop_map(|(a, n)| Edit::Delete(a, n)),
        1 => (any::<usize>(), snippet()).prop_map(|(a, s)| Edit::Insert(a, s)),
        1 => (any::<usize>(), snippet()).prop_map(|(a, s)| Edit::Replace(a, s)),
    ]
}

/// Whatever the parser accepts, the writer writes, and the parser reads that back to the
/// same devices and path classes.
fn check_no_panic(text: &str) -> Result<(), TestCaseError> {
    if let Ok(t) = parse(text) {
        let _ = t.matrix();
        let xml = to_nccl_xml(&t);
        let again = parse(&xml);
        prop_assert!(
            again.is_ok(),
            "export not readable: {:?}\n{}",
            again.err(),
            xml
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_reference_files_never_panic(
        pick in any::<usize>(),
        edits in proptest::collection::vec(edit(), 1..5),
    ) {
        let texts = reference_texts();
        let base = if texts.is_empty() { SMALL.to_string() } else { texts[pick % texts.len()].clone() };
        check_no_panic(&apply(&base, &edits))?;
    }

    #[test]
    fn edited_reference_files_round_trip(
        pick in any::<usize>(),
        edits in proptest::collection::vec(tame_edit(), 1..4),
    ) {
        let texts = reference_texts();
        let base = if texts.is_empty() { SMALL.to_string() } else { texts[pick % texts.len()].clone() };
        check_no_panic(&apply(&base, &edits))?;
    }

    #[test]
    fn random_text_never_panics(s in "\\PC{0,200}") {
        check_no_panic(&s)?;
    }

    #[test]
    fn random_xmlish_text_never_panics(parts in proptest::collection::vec(snippet(), 0..30)) {
        let text = format!("<system version=\"1\"><cpu numaid=\"0\">{}</cpu></system>", parts.concat());
        check_no_panic(&text)?;
    }
}
