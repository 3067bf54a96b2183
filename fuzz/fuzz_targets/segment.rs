//! Segment files over arbitrary bytes: `decode_segment_bytes` never panics and accounts for
//! every byte (decoded records + corrupt records = whole records, the rest a torn tail; corrupt
//! indices ascending and in range; every record it keeps is within the wire bounds and
//! re-encodes to itself; a header is the first record), and `read_segment` over the same bytes
//! in a file (the untrusted-file open path) reads exactly that, its `.open` flag from the name.
//! The names are parsed too: `parse_segment_name` round-trips through `segment_file_name`.
#![no_main]

use std::sync::OnceLock;

use comminsight_wire::bounds;
use comminsight_wire::record::{Body, Record, RECORD_SIZE};
use comminsight_wire::segment::{
    decode_segment_bytes, parse_segment_name, read_segment, segment_file_name,
};
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ci-fuzz-segment-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let read = decode_segment_bytes(data);
    let whole = data.len() / RECORD_SIZE;
    assert_eq!(read.records.len() + read.bad.len(), whole);
    assert_eq!(read.torn_tail_bytes, (data.len() % RECORD_SIZE) as u64);
    assert!(!read.open);
    assert!(read.bad.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(read.bad.iter().all(|(i, _)| (*i as usize) < whole));
    for r in &read.records {
        assert!(bounds::check(r).is_ok(), "kept {r:?}");
        assert_eq!(Record::decode(&r.encode()).as_ref(), Ok(r));
    }
    if let Some(h) = read.header() {
        assert!(matches!(&read.records[0].body, Body::Segment(x) if x == h));
    }
    // The same bytes as a file.
    let open = data.first().is_some_and(|b| b & 1 == 1);
    let path = dir().join(segment_file_name(7, open));
    std::fs::write(&path, data).expect("write segment");
    let from_file = read_segment(&path).expect("a regular file of ours reads");
    let _ = std::fs::remove_file(&path);
    assert_eq!(from_file.open, open);
    assert_eq!(from_file.records, read.records);
    assert_eq!(from_file.bad, read.bad);
    assert_eq!(from_file.torn_tail_bytes, read.torn_tail_bytes);
    // A name made of the first bytes.
    let name = String::from_utf8_lossy(&data[..data.len().min(40)]);
    if let Some((index, open)) = parse_segment_name(&name) {
        assert_eq!(
            parse_segment_name(&segment_file_name(index, open)),
            Some((index, open))
        );
    }
});
