//! NCCL topology XML in and out. (STUB — being written.)

use crate::{Topology, TopoError};
use std::path::Path;

/// Read an `NCCL_TOPO_FILE`-format file.
pub fn from_nccl_xml(path: &Path) -> Result<Topology, TopoError> {
    let text = std::fs::read_to_string(path).map_err(|e| TopoError::io(path, e))?;
    parse_nccl_xml(&text, path)
}

/// Parse NCCL topology XML text; `path` is only used in errors.
pub fn parse_nccl_xml(_text: &str, path: &Path) -> Result<Topology, TopoError> {
    Err(TopoError::NotATopology { path: path.to_path_buf(), why: "not implemented".into() })
}

/// Write the model as NCCL topology XML.
pub fn to_nccl_xml(_topo: &Topology) -> String {
    String::new()
}
