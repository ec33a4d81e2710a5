//! NCCL topology XML (the `NCCL_TOPO_FILE` format) in and out.
//!
//! # Reading
//!
//! [`parse_nccl_xml`] maps NCCL's elements onto the model:
//!
//! * `<cpu numaid affinity>` is one host bridge (id `cpu<numaid>`, e.g. `cpu0`, `cpu-1` for
//!   NCCL's "NUMA node unknown") and one [`NumaNode`](crate::NumaNode) whose CPU list comes
//!   from the affinity mask. NCCL XML records no host bridges of its own, so two devices under
//!   one `<cpu>` that share no switch are `PHB`, exactly as NCCL itself classes them (a sysfs
//!   model of the same machine may say `NODE` where they sit below different root complexes).
//! * A `<pci>` with `<pci>` children, or of bridge class `0x0604xx`, is one PCIe switch
//!   (NCCL collapses a switch's upstream and downstream ports into one element). NCCL's
//!   synthetic `ffff:ff:xx.x` bridges and vendor `0x0000`/`0xffff` ones are marked virtual.
//! * A leaf `<pci>` is a device whose kind comes from a `<nic>` child, a `<gpu>` child or its
//!   `class`, in that order (NCCL's own precedence). Leaves with none of these (vendor files
//!   that list bus ids only) stay out of the device list and are named in a note.
//! * `<gpu dev sm>` gives the GPU index and compute capability; `<nvlink target count
//!   tclass>` and `<c2c count>` its links. An NVLink whose target is the GPU's own bus id (a
//!   known quirk of Azure NC A100 v4 files) is left out with a note rather than guessed.
//! * `<nic>` (below a `<pci>`: that function is the NIC; directly below `<cpu>`: a NIC with no
//!   PCI address) with `<net name dev speed port>` children is one NIC whose RDMA name is the
//!   first net's name and whose ports are the nets.
//!
//! Malformed XML and misplaced or malformed NCCL elements are [`TopoError::Xml`] with the
//! line; a well-formed file of another kind (an `NCCL_GRAPH_FILE`) is
//! [`TopoError::NotATopology`]. No input makes the parser panic.
//!
//! # Writing
//!
//! [`to_nccl_xml`] writes what NCCL's own parser accepts (no XML declaration, space
//! indentation, one element per line), so the model of a machine can be handed to NCCL as
//! `NCCL_TOPO_FILE`. Facts the model does not know are left out, and NCCL fills those from
//! sysfs and NVML on the machine it runs on; the one exception is the CPU identity (`arch`,
//! `vendor`, ...), which NCCL needs on CPUs it does not reach itself (see [`CpuIdentity`]).
//! NCCL 2.28.9 loaded the exports of the reference files this way and ran an all-reduce.
//! Models that did not come from NCCL XML lose what the format cannot say: host bridges
//! (devices are grouped per NUMA node, so `NODE` pairs become `PHB`) and PCI devices of
//! unknown kind.

mod attrs;
mod cpuid;
mod cpumask;
mod depth;
mod export;
mod parse;

pub use cpuid::CpuIdentity;

use crate::{TopoError, Topology};
use std::path::Path;

pub use parse::{MAX_CPUS, MAX_DEVICES, MAX_PER_DEVICE, MAX_SWITCHES, NO_NVLINK_FACTS};

/// Largest topology file read. NCCL's own dumps of the biggest nodes are tens of KB; the cap
/// keeps a wrong path (`/dev/zero`, a log) from filling memory.
pub const MAX_XML_BYTES: u64 = 16 << 20;

/// Read an `NCCL_TOPO_FILE`-format file: a regular file of at most [`MAX_XML_BYTES`].
///
/// # Errors
/// [`TopoError::XmlInput`] for a FIFO, device or folder (never opened, so a FIFO cannot hang
/// the read), a file over the cap or not UTF-8; [`TopoError::Io`] when it cannot be read; the
/// errors of [`parse_nccl_xml`].
pub fn from_nccl_xml(path: &Path) -> Result<Topology, TopoError> {
    use std::io::Read as _;
    let refuse = |why: String| TopoError::XmlInput {
        path: path.to_path_buf(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| {
        refuse(format!(
            "{}: give the path of an NCCL_TOPO_FILE-format XML file",
            match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_string(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
                _ => e.to_string(),
            }
        ))
    })?;
    let ft = meta.file_type();
    if !ft.is_file() {
        use std::os::unix::fs::FileTypeExt as _;
        let what = if ft.is_dir() {
            "a folder"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(refuse(format!(
            "{what}, not a regular file: give the NCCL topology XML file itself (save a \
             generated one first, e.g. NCCL_TOPO_DUMP_FILE=topo.xml)"
        )));
    }
    let too_big = || {
        refuse(format!(
            "larger than {} MiB, the cap for a topology file (NCCL's dumps are tens of KB): \
             not an NCCL topology file",
            MAX_XML_BYTES >> 20
        ))
    };
    if meta.len() > MAX_XML_BYTES {
        return Err(too_big());
    }
    let file = std::fs::File::open(path).map_err(|e| TopoError::io(path, e))?;
    let mut bytes = Vec::new();
    // The file may have grown since metadata(): read one byte past the cap to know.
    file.take(MAX_XML_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| TopoError::io(path, e))?;
    if bytes.len() as u64 > MAX_XML_BYTES {
        return Err(too_big());
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        refuse(format!(
            "not UTF-8 text (invalid byte at offset {}): not an NCCL topology file",
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse_nccl_xml(&text, path)
}

/// Parse NCCL topology XML text; `path` is only used in errors and as the model's source.
pub fn parse_nccl_xml(text: &str, path: &Path) -> Result<Topology, TopoError> {
    parse::parse(text, path)
}

/// Write the model as NCCL topology XML (`NCCL_TOPO_FILE` format).
///
/// One `<cpu>` per NUMA node (devices whose node is unknown go under `numaid="-1"`, which is
/// what NCCL itself writes for them), switches as nested bridge `<pci>` elements, devices as
/// leaf `<pci>` elements with `<gpu>`/`<nvlink>` and `<nic>`/`<net>` children. NVSwitch links
/// use NCCL's "NVLink peer not visible" target `fffffff:ffff:ff` with the NVSwitch class.
/// Devices are grouped by NUMA node rather than by root complex: NCCL knows one CPU per node.
/// Every `<cpu>` carries the identity of [`CpuIdentity::for_topology`], which NCCL needs on
/// CPUs it does not fill itself; [`to_nccl_xml_with`] takes it from the caller instead.
pub fn to_nccl_xml(topo: &Topology) -> String {
    to_nccl_xml_with(topo, CpuIdentity::for_topology(topo).as_ref())
}

/// [`to_nccl_xml`] with the CPU identity given (`None`: no `arch`/`vendor`/`familyid`/
/// `modelid` attributes, which suits NCCL only where it reaches every CPU itself).
pub fn to_nccl_xml_with(topo: &Topology, cpu: Option<&CpuIdentity>) -> String {
    export::export(topo, cpu)
}
