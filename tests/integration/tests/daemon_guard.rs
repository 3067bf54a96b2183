//! Issue 16: one daemon per state directory, and `config check` refuses what `run` refuses.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use comminsight_tests::*;

/// A second daemon on the same state directory stops with one line naming the lock, the
/// holder's pid and the fix; the first keeps running.
#[test]
fn a_second_daemon_on_the_same_state_directory_is_refused_with_one_line() {
    let out = OutDir::new("daemon-lock");
    std::fs::create_dir_all(out.path().join("logs")).unwrap();
    let conf = out.path().join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = {s:?}\n[sources]\nshm_enabled = false\nsegment_dirs = [{l:?}]\n[master]\nlisten = \"\"\n[archive]\nenabled = false\n[otlp]\nenabled = false\n",
            s = out.path().join("state"),
            l = out.path().join("logs"),
        ),
    )
    .unwrap();
    let log1 = out.path().join("first.log");
    let mut first = start_agent(&conf, &log1);
    assert!(
        wait_until(Duration::from_secs(30), || std::fs::read_to_string(&log1)
            .unwrap_or_default()
            .contains("comminsight-agent running")),
        "the first daemon did not start"
    );
    let o = agent(&["run", "--config", conf.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a second daemon ran: {err}");
    let lock = out.path().join("state").join("agent.lock");
    let line = format!(
        "another comminsight-agent (pid {}) holds {}; stop it or set agent.state_dir to another directory",
        first.pid(),
        lock.display()
    );
    assert!(err.contains(&line), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("agent.lock")).count(),
        1,
        "one line: {err}"
    );
    // The refused daemon wrote nothing: no second archive or export of the same records.
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("running") && !err.contains("running"),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        first.0.try_wait().unwrap().is_none(),
        "the first daemon stopped"
    );
}

/// `config check` runs the link checks `run` runs: a token file readable by every user is
/// refused by both, with the same fix.
#[test]
fn config_check_refuses_the_token_settings_run_refuses() {
    let out = OutDir::new("config-check-token");
    std::fs::create_dir_all(out.path().join("logs")).unwrap();
    let token = out.path().join("token");
    std::fs::write(&token, "secret\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let conf = out.path().join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = {s:?}\n[sources]\nshm_enabled = false\nsegment_dirs = [{l:?}]\n[master]\nlisten = \"127.0.0.1:0\"\ntoken_file = {token:?}\n[archive]\nenabled = false\n[otlp]\nenabled = false\n",
            s = out.path().join("state"),
            l = out.path().join("logs"),
        ),
    )
    .unwrap();
    let check = agent(&["config", "check", conf.to_str().unwrap()]);
    let run = agent(&["run", "--config", conf.to_str().unwrap()]);
    for (what, o) in [("config check", &check), ("run", &run)] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{what} accepted a world-readable token file"
        );
        assert!(err.contains("chmod 600"), "{what}: {err}");
    }
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let check = agent(&["config", "check", conf.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
