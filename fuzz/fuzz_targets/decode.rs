//! Record decoding over arbitrary bytes: `Record::decode` (header, body, the wire bounds) never
//! panics, a record it accepts is within the bounds and re-encodes to a record that decodes to
//! itself.
#![no_main]

use comminsight_wire::bounds;
use comminsight_wire::record::{RawRecord, Record, RECORD_SIZE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks(RECORD_SIZE) {
        let mut raw = RawRecord::ZERO;
        raw.0[..chunk.len()].copy_from_slice(chunk);
        let Ok(rec) = Record::decode(&raw) else {
            continue;
        };
        assert!(bounds::check(&rec).is_ok(), "decode accepted {rec:?}");
        let again = Record::decode(&rec.encode()).expect("a decoded record re-decodes");
        assert_eq!(again, rec);
    }
});
