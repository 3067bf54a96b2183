use super::*;
use crate::testutil::{fixture, small_cfg};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!(
        "ci-ctl-{tag}-{}-{}",
        std::process::id(),
        sys::real_ns()
    ));
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn counts(sh: &Shared) -> (u64, u64) {
    (
        sh.counters.ctl_refused.load(Ordering::Relaxed),
        sh.counters.mask_changes.load(Ordering::Relaxed),
    )
}

/// Rewrite the file with a later mtime, so the change is seen whatever the clock granularity.
fn write(path: &std::path::Path, text: &str, bump: u64) {
    std::fs::write(path, text).unwrap();
    let f = File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() + Duration::from_secs(bump))
        .unwrap();
}

#[test]
fn mask_changes_are_applied_and_counted_once_each() {
    let (sh, _ring) = fixture(small_cfg());
    let d = tmp("ok");
    let path = d.0.join("x.ring.ctl");
    let mut nccl_mask: core::ffi::c_int = 0;
    sh.mask_ptr.store(&raw mut nccl_mask, Ordering::Release);
    sh.write_mask();
    assert_eq!(nccl_mask, 0x747);
    let mut c = Control::new(path.clone());
    c.check(sh);
    assert_eq!(counts(sh), (0, 0), "no file: nothing");
    write(&path, "# agent\nevent_mask=Coll|KernelCh|ProxyOp\n", 1);
    c.check(sh);
    c.check(sh);
    assert_eq!(sh.mask(), 0x4a);
    // SAFETY: plain read of our own local; no drain thread runs.
    assert_eq!(unsafe { (&raw const nccl_mask).read_volatile() }, 0x4a);
    assert_eq!(counts(sh), (0, 1), "one change, counted once");
    write(&path, "event_mask=Bogus\n", 5);
    c.check(sh);
    assert_eq!(sh.mask(), 0x4a, "a bad file changes nothing");
    write(&path, "event_mask=0x4a\n", 7);
    c.check(sh);
    assert_eq!(counts(sh), (0, 1), "the same mask again is no change");
    write(&path, "event_mask=0x46\nfuture_key=1\n", 10);
    c.check(sh);
    assert_eq!(sh.mask(), 0x46);
    assert_eq!(counts(sh), (0, 2));
    sh.mask_ptr.store(core::ptr::null_mut(), Ordering::Release);
    assert_eq!(parse_control("event_mask=2"), Ok(Some(2)));
    assert!(parse_control("garbage").is_err());
}

#[test]
fn a_control_file_of_another_user_or_writable_by_others_is_ignored_and_counted() {
    let (sh, _ring) = fixture(small_cfg());
    let before = sh.mask();
    let d = tmp("foreign");
    let path = d.0.join("x.ring.ctl");
    write(&path, "event_mask=0\n", 1);
    std::os::unix::fs::chown(&path, Some(12345), None).unwrap();
    let mut c = Control::new(path.clone());
    c.check(sh);
    c.check(sh);
    assert_eq!(
        sh.mask(),
        before,
        "event_mask=0 from uid 12345 silences nothing"
    );
    assert_eq!(counts(sh), (1, 0), "counted once while unchanged");
    // Rewritten by them again: counted again.
    write(&path, "event_mask=0\n", 3);
    c.check(sh);
    assert_eq!(counts(sh), (2, 0));
    // Ours, but group/other-writable: refused as well.
    std::os::unix::fs::chown(&path, Some(sys::euid()), None).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    c.check(sh);
    assert_eq!((sh.mask(), counts(sh)), (before, (3, 0)));
    // Fixed: accepted.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    c.check(sh);
    assert_eq!((sh.mask(), counts(sh)), (0, (3, 1)));
    sh.set_mask(before);
}

#[test]
fn a_fifo_or_symlinked_control_file_neither_blocks_nor_is_read() {
    let (sh, _ring) = fixture(small_cfg());
    let before = sh.mask();
    let d = tmp("fifo");
    let fifo = d.0.join("f.ring.ctl");
    let cpath = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let zero = d.0.join("z.ring.ctl");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let good = d.0.join("good");
    write(&good, "event_mask=0x2\n", 1);
    let linked = d.0.join("l.ring.ctl");
    std::os::unix::fs::symlink(&good, &linked).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for p in [fifo, zero, linked] {
            Control::new(p).check(sh);
        }
        let _ = tx.send(());
    });
    // A check stuck in open() or read() is left behind (the test process exits regardless).
    rx.recv_timeout(Duration::from_secs(10))
        .expect("checking the control file blocked");
    assert_eq!(sh.mask(), before);
    assert_eq!(counts(sh), (3, 0));
}
