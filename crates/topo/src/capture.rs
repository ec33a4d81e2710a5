//! `gdx topo --capture`: copy the sysfs/proc files gdx reads. (STUB — being written.)

use crate::TopoError;
use std::path::Path;

/// Capture the tree under `root` into `out` (a folder, or a `.tar.gz` when the name ends so).
pub fn capture(_root: &Path, _out: &Path) -> Result<(), TopoError> {
    Ok(())
}
