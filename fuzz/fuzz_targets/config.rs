//! The agent's configuration loader over arbitrary input, as the daemon and `config check` run
//! it (`load_with_warnings`: the untrusted-file open and checks, TOML parse with the error's
//! line and column, the key table, drop-in merge, `COMMINSIGHT_*` overrides, deserialization,
//! validation), from a private temp directory. The input: the main file's text, then after a
//! NUL the environment (`NAME=value` lines; a NAME that is a number picks that agent key's
//! variable), then after a second NUL a drop-in `conf.d/50-fuzz.toml`. Nothing may panic, every
//! error renders, and a configuration accepted once loads the same again.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use comminsight_agent::config::keys::{ENV_PREFIX, KEYS};
use comminsight_agent::config::load_with_warnings;
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ci-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(d.join("conf.d")).expect("temp dir");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let main = parts.next().unwrap_or_default();
    let env_text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let drop_in = parts.next();
    let env: Vec<(String, String)> = env_text
        .lines()
        .take(64)
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let name = match k.parse::<usize>() {
                Ok(i) => KEYS[i % KEYS.len()].env_name(),
                Err(_) if k.starts_with(ENV_PREFIX) => k.to_string(),
                Err(_) => format!("{ENV_PREFIX}{k}"),
            };
            (name, v.to_string())
        })
        .collect();
    let path = dir().join("agent.toml");
    std::fs::write(&path, main).expect("write config");
    let extra = dir().join("conf.d").join("50-fuzz.toml");
    match drop_in {
        Some(b) => std::fs::write(&extra, b).expect("write drop-in"),
        None => {
            let _ = std::fs::remove_file(&extra);
        }
    }
    match load_with_warnings(Some(&path), &env) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                assert!(!w.is_empty());
            }
            let again = load_with_warnings(Some(&path), &env).expect("loads again");
            assert_eq!(again.config, loaded.config);
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
        }
    }
});
