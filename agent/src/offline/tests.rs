//! The offline input over a real (synthetic) test-bed job and over the same job archived:
//! archives are staged once per command, and every analysis gives the same result either way.

use std::path::{Path, PathBuf};

use super::staging::STAGED;
use super::{steps, straggler, Input, Settings};
use crate::util::fs::{files_under, ScratchDir};
use crate::util::testbed::synthetic;

/// `logs` archived as the daemon lays it out: `<archive>/raw/<job>/<host>/<pid>/seg-N.cis.zst`.
fn archive(logs: &Path, archive: &Path) -> usize {
    let segs = files_under(logs, 4, &|n| n.ends_with(".cis"));
    for f in &segs {
        let rel = f.strip_prefix(logs).unwrap();
        let mut name = rel.file_name().unwrap().to_os_string();
        name.push(".zst");
        let dest: PathBuf = archive.join("raw").join(rel.parent().unwrap()).join(name);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let bytes = zstd::encode_all(std::fs::File::open(f).unwrap(), 1).unwrap();
        std::fs::write(dest, bytes).unwrap();
    }
    segs.len()
}

#[test]
fn an_archive_is_staged_once_per_report_and_analyses_agree_with_the_raw_segments() {
    let dir = ScratchDir::new("offline-archive");
    let job = dir.path().join("job");
    synthetic(&job, "megatron.toml", 8, 12);
    let arch = dir.path().join("archive");
    let segments = archive(&job.join("inspector_logs"), &arch);
    assert!(segments >= 8, "{segments} segments");
    let settings = Settings::default();

    // The report: three passes over one input, the archive decompressed once.
    STAGED.with(|c| c.set(0));
    let input = Input::open(&arch).unwrap();
    let models = crate::report::gather(&input, &settings, &Default::default()).unwrap();
    drop(input);
    assert_eq!(
        STAGED.with(|c| c.get()),
        segments,
        "each segment staged exactly once"
    );
    let raw = Input::open(&job).unwrap();
    assert_eq!(
        STAGED.with(|c| c.get()),
        segments,
        "raw segments are not staged"
    );
    let raw_models = crate::report::gather(&raw, &settings, &Default::default()).unwrap();
    assert_eq!(models.len(), 1);
    let (a, b) = (&models[0], &raw_models[0]);
    assert_eq!(a.ranks.len(), 8);
    assert_eq!(a.step_stats.len(), b.step_stats.len());
    assert_eq!(
        serde_json::to_value(&a.ranks).unwrap(),
        serde_json::to_value(&b.ranks).unwrap()
    );

    // Steps and straggler reports: equal from the archive and from the segments.
    let from = |i: &Input| {
        let d = steps::decisions(&steps::topology(i), &settings.templates);
        let out = ScratchDir::new("offline-steps");
        let jobs = steps::rebuild_into(
            i,
            &settings,
            d,
            &mut steps::StepInputs::default(),
            &mut crate::sinks::step_journal::StepJournal::new(out.path()),
        )
        .unwrap();
        let reps = straggler::reports(i, &settings, &Default::default()).unwrap();
        (
            serde_json::to_value(jobs).unwrap(),
            serde_json::to_value(reps).unwrap(),
        )
    };
    assert_eq!(from(&Input::open(&arch).unwrap()), from(&raw));
}

#[test]
fn a_directory_below_an_archive_root_keeps_only_its_streams_and_errors_name_the_input() {
    let dir = ScratchDir::new("offline-below");
    let job = dir.path().join("job");
    synthetic(&job, "megatron.toml", 4, 3);
    let arch = dir.path().join("archive");
    archive(&job.join("inspector_logs"), &arch);
    let all = Input::open(&arch).unwrap();
    let one: Vec<_> = all.streams().take(1).cloned().collect();
    let below = arch.join("raw").join(one[0].rel_dir());
    let only = Input::open(&below).unwrap();
    assert_eq!(only.streams().cloned().collect::<Vec<_>>(), one);
    let e = Input::open(&dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope") && e.contains("no such directory"), "{e}");
    std::fs::create_dir_all(dir.path().join("empty")).unwrap();
    let e = Input::open(&dir.path().join("empty"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no segment files"), "{e}");
}

/// Every file under `dir` by path relative to it -> bytes.
fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    files_under(dir, 4, &|_| true)
        .into_iter()
        .map(|p| {
            (
                p.strip_prefix(dir).unwrap().to_path_buf(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn steps_fed_from_the_first_pass_equal_steps_read_again() {
    let dir = ScratchDir::new("offline-kept");
    let job = dir.path().join("job");
    synthetic(&job, "megatron.toml", 8, 20);
    let input = Input::open(&job).unwrap();
    let settings = Settings::default();
    let rebuild = |budget: usize, out: &Path| {
        let mut kept = steps::StepInputs::new(budget);
        let d = steps::decisions(&steps::first_pass(&input, &mut kept), &settings.templates);
        let mut journal = crate::sinks::step_journal::StepJournal::new(out);
        steps::rebuild_into(&input, &settings, d, &mut kept, &mut journal).unwrap();
    };
    let (all, some, none) = (
        dir.path().join("all"),
        dir.path().join("some"),
        dir.path().join("none"),
    );
    rebuild(steps::CACHED_OPS, &all);
    // A budget of about three streams: the rest is read again.
    let ops_per_stream = 20 * 160;
    rebuild(3 * ops_per_stream, &some);
    rebuild(0, &none);
    let want = tree(&none);
    assert_eq!(want.len(), 9, "8 stream files and job.json");
    assert_eq!(tree(&all), want, "every stream fed from pass 1");
    assert_eq!(tree(&some), want, "some streams fed from pass 1");
}
