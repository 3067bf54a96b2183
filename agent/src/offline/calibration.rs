//! The step calibration a job directory keeps (`DIR/.comminsight/steps-calibration.json`,
//! written by `steps --calibrate apply`): one loader, one writer, used by every offline reader
//! (`steps`, `straggler`, `report`, `trace`), so all of them show the same step numbers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::steps::calibrate::Calibration;
use comminsight_wire::fsafe::Owner;

use crate::util::fs::{euid, read_state, state_dir, to_io, write_state, STATE_DIR_NAME};

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

/// The calibration's file name in the state directory.
const FILE: &str = "steps-calibration.json";

/// Where `dir` keeps its applied calibration.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(STATE_DIR_NAME).join(FILE)
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
    match read_state(dir, FILE) {
        Ok(Some(b)) => {
            serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| CalibrationError::Corrupt {
                    path,
                    message: e.to_string(),
                })
        }
        Ok(None) => Ok(None),
        Err(e) if absent(&e) => Ok(None),
        Err(source) => Err(CalibrationError::Read { path, source }),
    }
}

/// Save `c` as `dir`'s applied calibration; returns the file.
pub fn save(dir: &Path, c: &Calibrations) -> Result<PathBuf, CalibrationError> {
    let text = serde_json::to_string_pretty(c).expect("calibrations serialize");
    write_state(dir, FILE, text.as_bytes()).map_err(|source| CalibrationError::Save {
        path: path(dir),
        source,
    })
}

/// Remove `dir`'s applied calibration; `Ok(None)` when there was none, else the file removed.
/// Only a calibration in a state directory of this user's is removed (never through a link).
pub fn clear(dir: &Path) -> Result<Option<PathBuf>, CalibrationError> {
    let path = path(dir);
    let remove = |source| CalibrationError::Remove {
        path: path.clone(),
        source,
    };
    let d = match state_dir(dir, false) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(None),
        Err(e) if absent(&e) => return Ok(None),
        Err(e) => return Err(remove(e)),
    };
    match d.file(Path::new(FILE), Owner::Uid(euid())) {
        Ok(_) => {
            d.remove(std::ffi::OsStr::new(FILE));
            Ok(Some(path))
        }
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(remove(to_io(e))),
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
        assert_eq!(load(dir).unwrap(), Some(c.clone()));
        std::fs::write(&p, b"{nope").unwrap();
        let e = load(dir).unwrap_err().to_string();
        assert!(
            e.contains("not a calibration") && e.contains("--calibrate clear"),
            "{e}"
        );
        assert_eq!(clear(dir).unwrap(), Some(p));
        assert_eq!(clear(dir).unwrap(), None);
        // A state "directory" that is a file, or a link planted in its place, is refused by
        // name, and nothing is written through it.
        std::fs::remove_dir_all(dir.join(STATE_DIR_NAME)).unwrap();
        std::fs::write(dir.join(STATE_DIR_NAME), b"x").unwrap();
        let e = load(dir).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        std::fs::remove_file(dir.join(STATE_DIR_NAME)).unwrap();
        let elsewhere = dir.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join(STATE_DIR_NAME)).unwrap();
        assert!(load(dir).is_err());
        assert!(save(dir, &c).is_err());
        assert_eq!(
            std::fs::read_dir(&elsewhere).unwrap().count(),
            0,
            "nothing written through the link"
        );
    }
}
