//! Headless Chromium for the HTML report tests: dump the DOM after the page's scripts ran, take
//! screenshots, and collect what the page logged (every console line, uncaught errors too).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::TempDir;

/// The browser (Debian `chromium-headless-shell`, installed by `cargo xtask deps`).
pub const CHROMIUM: &str = "/usr/bin/chromium-headless-shell";

/// What a run of the browser gave.
pub struct Browser {
    /// Standard output (the DOM for `--dump-dom`).
    pub stdout: String,
    /// The page's console lines (`:INFO:CONSOLE` on standard error), uncaught errors included.
    pub console: Vec<String>,
    pub wall: Duration,
}

fn chromium() -> PathBuf {
    let p = PathBuf::from(CHROMIUM);
    assert!(
        p.exists(),
        "missing test tool {CHROMIUM}: run `cargo xtask deps`"
    );
    p
}

/// Run the browser on `page` (a local file) with `extra` arguments; killed after `limit`.
pub fn run(page: &Path, extra: &[String], limit: Duration) -> Browser {
    let profile = TempDir::new("chromium");
    let out = TempDir::new("chromium-out");
    let (so, se) = (out.path().join("stdout"), out.path().join("stderr"));
    let url = format!(
        "file://{}",
        page.canonicalize().expect("page exists").display()
    );
    let t0 = Instant::now();
    let mut child = Command::new(chromium())
        .args([
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap())
        .spawn()
        .expect("start chromium");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for chromium") {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {url} within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let wall = t0.elapsed();
    let stdout = std::fs::read_to_string(&so).unwrap_or_default();
    let stderr = std::fs::read_to_string(&se).unwrap_or_default();
    assert!(
        status.success(),
        "chromium failed on {url}: {status}\n{stderr}"
    );
    Browser {
        stdout,
        console: stderr
            .lines()
            .filter(|l| l.contains(":INFO:CONSOLE"))
            .map(str::to_string)
            .collect(),
        wall,
    }
}

/// The DOM after the scripts ran.
pub fn dump_dom(page: &Path) -> Browser {
    run(page, &["--dump-dom".into()], Duration::from_secs(180))
}

/// A screenshot of the first `w` × `h` pixels.
pub fn screenshot(page: &Path, png: &Path, w: u32, h: u32) -> Browser {
    let b = run(
        page,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={w},{h}"),
        ],
        Duration::from_secs(180),
    );
    let len = std::fs::metadata(png).map(|m| m.len()).unwrap_or(0);
    assert!(len > 1000, "{}: no screenshot ({len} bytes)", png.display());
    b
}

/// The text of the element with `id` in a dumped DOM, tags stripped (the element's own tag
/// name is assumed not to nest).
pub fn element_text(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open = dom[..at].rfind('<')?;
    let tag: String = dom[open + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let body_start = open + dom[open..].find('>')? + 1;
    let close = body_start + dom[body_start..].find(&format!("</{tag}>"))?;
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom[body_start..close].chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}
