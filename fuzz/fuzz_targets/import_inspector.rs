//! NCCL Inspector JSON lines over arbitrary bytes: the line parser never panics.
#![no_main]

use comminsight_import::inspector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for line in String::from_utf8_lossy(data).lines() {
        let _ = inspector::parse_line(line);
    }
});
