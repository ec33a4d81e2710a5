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
//! sysfs and NVML on the machine it runs on.

mod attrs;
mod cpumask;
mod depth;
mod export;
mod parse;

use crate::{TopoError, Topology};
use std::path::Path;

/// Read an `NCCL_TOPO_FILE`-format file.
pub fn from_nccl_xml(path: &Path) -> Result<Topology, TopoError> {
    let text = std::fs::read_to_string(path).map_err(|e| TopoError::io(path, e))?;
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
/// Devices grouped by NUMA node rather than by root complex: NCCL knows one CPU per node.
pub fn to_nccl_xml(topo: &Topology) -> String {
    export::export(topo)
}
