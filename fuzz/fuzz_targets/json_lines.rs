//! JSON lines over arbitrary bytes. Records (`comminsight_wire::json::from_line`, what `dump
//! --json` writes and `replay` / the offline commands read): never panics; a record it accepts
//! renders back (`to_value`, and `JsonRenderer::render_line` with its derived fields) to a line
//! that parses to the same record, and one within the wire bounds encodes to a binary record
//! that decodes to itself (a name longer than its binary field is cut and the record flagged
//! truncated, as designed). The agent's other JSON-lines files, read from a private temp
//! directory: step journals (`step_journal::read_stream`, a torn last line tolerated, a bad
//! earlier one an error) and the clock book (`ClockBook::open`, bad lines skipped).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use comminsight_agent::clock::ClockBook;
use comminsight_agent::sinks::step_journal::read_stream;
use comminsight_wire::bounds;
use comminsight_wire::json::{from_line, to_value, JsonRenderer};
use comminsight_wire::record::{Record, FLAG_TRUNCATED};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ci-fuzz-json-{}", std::process::id()));
        std::fs::create_dir_all(d.join("clock")).expect("temp dir");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut renderer = JsonRenderer::new();
    for line in text.lines() {
        let Ok(rec) = from_line(line) else { continue };
        let plain = Value::Object(to_value(&rec)).to_string();
        assert_eq!(
            from_line(&plain).as_ref().ok(),
            Some(&rec),
            "to_value: {plain}"
        );
        let derived = renderer.render_line(&rec);
        assert_eq!(
            from_line(&derived).as_ref().ok(),
            Some(&rec),
            "render_line: {derived}"
        );
        if bounds::check(&rec).is_ok() {
            // Names longer than their binary field are cut (at a character boundary) and the
            // record flagged truncated; anything else comes back as it was.
            let back = Record::decode(&rec.encode()).expect("a record within the bounds encodes");
            if back != rec {
                assert_ne!(back.flags & FLAG_TRUNCATED, 0, "{rec:?} -> {back:?}");
                assert_eq!(back.flags & !FLAG_TRUNCATED, rec.flags & !FLAG_TRUNCATED);
                assert_eq!(back.kind(), rec.kind());
                assert_eq!(back.seq, rec.seq);
            }
            assert_eq!(Record::decode(&back.encode()).as_ref(), Ok(&back));
        }
    }
    let journal = dir().join("stream.jsonl");
    std::fs::write(&journal, data).expect("write journal");
    if let Ok(steps) = read_stream(&journal) {
        let lines = data
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert!(steps.len() <= lines);
    }
    std::fs::write(ClockBook::file_in(dir()), data).expect("write clock book");
    if let Ok(book) = ClockBook::open(dir()) {
        assert!(book.len() <= text.lines().count());
    }
});
