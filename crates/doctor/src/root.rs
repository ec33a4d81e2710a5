//! Opening `--root`: a folder is read in place; a `.tar.gz`/`.tgz` capture is unpacked into a
//! temporary folder that lives as long as the [`OpenRoot`]. A folder that holds no sysfs at all
//! is still accepted: every check then skips with its reason.

use crate::DoctorError;
use std::path::{Path, PathBuf};

/// A root ready to read.
pub(crate) struct OpenRoot {
    dir: PathBuf,
    _unpacked: Option<tempfile::TempDir>,
}

impl OpenRoot {
    /// The folder to read as `/`.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

fn is_tarball(p: &Path) -> bool {
    let n = p.to_string_lossy().to_ascii_lowercase();
    n.ends_with(".tar.gz") || n.ends_with(".tgz")
}

/// Check and open a root.
pub(crate) fn open(root: &Path) -> Result<OpenRoot, DoctorError> {
    let unusable = |why: String| DoctorError::RootUnusable {
        path: root.to_path_buf(),
        why,
    };
    let meta = match std::fs::metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DoctorError::RootMissing(root.to_path_buf()))
        }
        Err(e) => return Err(unusable(e.to_string())),
    };
    if meta.is_dir() {
        return Ok(OpenRoot {
            dir: root.to_path_buf(),
            _unpacked: None,
        });
    }
    if !is_tarball(root) {
        return Err(unusable(
            "a file, not a folder or a .tar.gz/.tgz capture".into(),
        ));
    }
    let file = std::fs::File::open(root).map_err(|e| unusable(e.to_string()))?;
    let tmp = tempfile::Builder::new()
        .prefix("gdx-doctor-root-")
        .tempdir()
        .map_err(|e| unusable(format!("cannot make a temporary folder: {e}")))?;
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    ar.set_preserve_permissions(false);
    ar.set_overwrite(true);
    ar.unpack(tmp.path())
        .map_err(|e| unusable(format!("cannot unpack as .tar.gz: {e}")))?;
    // Accept a tarball of the capture folder itself (one top-level folder) as well as one
    // made from inside it.
    let mut dir = tmp.path().to_path_buf();
    if !dir.join("sys").is_dir() {
        let tops: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| unusable(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        if let [one] = tops.as_slice() {
            if one.join("sys").is_dir() {
                dir = one.clone();
            }
        }
    }
    Ok(OpenRoot {
        dir,
        _unpacked: Some(tmp),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_and_tarball_roots() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            open(&dir.path().join("nope")),
            Err(DoctorError::RootMissing(_))
        ));
        let f = dir.path().join("x.txt");
        std::fs::write(&f, "hi").unwrap();
        assert!(matches!(open(&f), Err(DoctorError::RootUnusable { .. })));
        // A capture tarball with one top-level folder.
        let src = dir.path().join("cap/sys/module/nvidia");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("version"), "580.159.04\n").unwrap();
        let tgz = dir.path().join("cap.tar.gz");
        {
            let gz = flate2::write::GzEncoder::new(
                std::fs::File::create(&tgz).unwrap(),
                flate2::Compression::fast(),
            );
            let mut b = tar::Builder::new(gz);
            b.append_dir_all("cap", dir.path().join("cap")).unwrap();
            b.into_inner().unwrap().finish().unwrap();
        }
        let o = open(&tgz).unwrap();
        assert_eq!(
            std::fs::read_to_string(o.dir().join("sys/module/nvidia/version")).unwrap(),
            "580.159.04\n"
        );
        let garbage = dir.path().join("bad.tgz");
        std::fs::write(&garbage, "not gzip").unwrap();
        assert!(matches!(
            open(&garbage),
            Err(DoctorError::RootUnusable { .. })
        ));
    }
}
