//! Issue 6, the master's authentication with two real daemons on this host: a member agent with
//! the job's token syncs its clock over the gRPC link; one with a wrong token is refused, keeps
//! running, and the master logs the refusal (once per peer per minute) and stores nothing. The
//! Push / outbox / restart / TLS cases run in `agent/tests/master_link.rs` (library + daemon).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use comminsight_tests::*;

fn token_file(path: &Path, token: &str) -> PathBuf {
    std::fs::write(path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_path_buf()
}

/// A daemon config in `out/<name>` with `master` as its `[master]` section.
fn conf(out: &Path, name: &str, master: &str) -> (PathBuf, PathBuf) {
    let dir = out.join(name);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[agent]\nstate_dir = \"{d}/state\"\nhost_name = \"{name}\"\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{d}/logs\"]\n\
             [archive]\nenabled = false\n[clock]\nsync_interval_s = 1\n{master}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    (dir, path)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn a_member_with_the_token_syncs_and_one_with_a_wrong_token_is_refused_and_logged() {
    let out = OutDir::new("master-link");
    std::fs::create_dir_all(out.path()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let good = token_file(&out.path().join("token"), "job-secret-1");
    let bad = token_file(&out.path().join("bad-token"), "job-secret-2");
    let (mdir, mconf) = conf(
        out.path(),
        "master",
        &format!(
            "[master]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"",
            good.display()
        ),
    );
    let member = |name: &str, token: &Path| {
        conf(
            out.path(),
            name,
            &format!(
                "[master]\nlisten = \"\"\naddress = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"",
                token.display()
            ),
        )
    };
    let (gdir, gconf) = member("good", &good);
    let (_bdir, bconf) = member("bad", &bad);
    let (mlog, glog, blog) = (
        out.path().join("master.log"),
        out.path().join("good.log"),
        out.path().join("bad.log"),
    );
    let _master = start_agent(&mconf, &mlog);
    let _good = start_agent(&gconf, &glog);
    let mut badd = start_agent(&bconf, &blog);

    let book = gdir.join("state/clock/host-offsets.jsonl");
    assert!(
        wait_until(Duration::from_secs(30), || read(&book).lines().count() >= 2),
        "no offset measurements with the right token; member log:\n{}\nmaster log:\n{}",
        read(&glog),
        read(&mlog)
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            read(&mlog)
                .lines()
                .any(|l| l.contains("refused Time from 127.0.0.1:") && l.contains("wrong token"))
        }),
        "no refusal line in the master's log:\n{}",
        read(&mlog)
    );
    assert!(
        wait_until(Duration::from_secs(30), || read(&blog)
            .contains("wrong or missing token")),
        "the refused member does not say why:\n{}",
        read(&blog)
    );
    // The refused member retries every second; within the minute the master logs one line.
    std::thread::sleep(Duration::from_secs(3));
    let log = read(&mlog);
    assert_eq!(
        log.matches("agent link: refused").count(),
        1,
        "one line per peer per minute:\n{log}"
    );
    assert!(
        badd.0.try_wait().unwrap().is_none(),
        "the refused member keeps running"
    );
    assert_eq!(
        std::fs::read_dir(mdir.join("state/master"))
            .unwrap()
            .count(),
        0,
        "nothing stored from a refused agent"
    );
}
