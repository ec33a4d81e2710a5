//! Discovery from a sysfs/proc tree under a root folder. (STUB — being written.)

use crate::{Topology, TopoError};
use std::path::Path;

/// Build the model from `root/sys/...` and `root/proc/...`.
pub fn from_root(root: &Path) -> Result<Topology, TopoError> {
    Err(TopoError::RootMissing { path: root.to_path_buf() })
}
