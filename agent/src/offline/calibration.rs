//! The step calibration a job directory keeps (`DIR/.comminsight/steps-calibration.json`,
//! written by `steps --calibrate apply`): one loader, one writer, used by every offline reader
//! (`steps`, `straggler`, `report`, `trace`), so all of them show the same step numbers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::steps::calibrate::Calibration;
use crate::util::fs::{write_atomic, STATE_DIR_NAME};

/// Each job's calibration, by job id.
pub type Calibrations = BTreeMap<String, Calibration>;

/// Why a saved calibration could not be read, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("{path}: not a calibration ({message}); run `steps --calibrate clear` or `--calibrate apply` again")]
    Corrupt { path: PathBuf, message: String },
    #[error("{path}: cannot read the calibration: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot save the calibration ({source}); use --calibrate preview on a read-only directory")]
    Save {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot remove: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where `dir` keeps its applied calibration.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(STATE_DIR_NAME).join("steps-calibration.json")
}

/// No such file, or its state directory is not a directory: nothing saved.
fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// The applied calibration of `dir`'s jobs (`None`: none saved).
pub fn load(dir: &Path) -> Result<Option<Calibrations>, CalibrationError> {
    let path = path(dir);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| CalibrationError::Corrupt {
                path,
                message: e.to_string(),
            }),
        Err(e) if absent(&e) => Ok(None),
        Err(source) => Err(CalibrationError::Read { path, source }),
    }
}

/// Save `c` as `dir`'s applied calibration; returns the file.
pub fn save(dir: &Path, c: &Calibrations) -> Result<PathBuf, CalibrationError> {
    let path = path(dir);
    let text = serde_json::to_string_pretty(c).expect("calibrations serialize");
    let res = std::fs::create_dir_all(path.parent().expect("has a parent"))
        .and_then(|()| write_atomic(&path, text.as_bytes()));
    res.map_err(|source| CalibrationError::Save {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Remove `dir`'s applied calibration; `Ok(None)` when there was none, else the file removed.
pub fn clear(dir: &Path) -> Result<Option<PathBuf>, CalibrationError> {
    let path = path(dir);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(Some(path)),
        Err(e) if absent(&e) => Ok(None),
        Err(source) => Err(CalibrationError::Remove { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_loader_for_absent_saved_corrupt_and_cleared() {
        let s = crate::util::fs::ScratchDir::new("calibration");
        let dir = s.path();
        std::fs::create_dir_all(dir).unwrap();
        assert!(load(dir).unwrap().is_none());
        let mut c = Calibrations::new();
        c.insert("j".into(), Calibration::default());
        let p = save(dir, &c).unwrap();
        assert_eq!(load(dir).unwrap(), Some(c));
        std::fs::write(&p, b"{nope").unwrap();
        let e = load(dir).unwrap_err().to_string();
        assert!(
            e.contains("not a calibration") && e.contains("--calibrate clear"),
            "{e}"
        );
        assert_eq!(clear(dir).unwrap(), Some(p));
        assert_eq!(clear(dir).unwrap(), None);
        // A state "directory" that is a file holds no calibration.
        std::fs::remove_dir_all(dir.join(STATE_DIR_NAME)).unwrap();
        std::fs::write(dir.join(STATE_DIR_NAME), b"x").unwrap();
        assert!(load(dir).unwrap().is_none());
    }
}
