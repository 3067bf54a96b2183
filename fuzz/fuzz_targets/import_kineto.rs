//! Kineto traces over arbitrary bytes: the streaming parser never panics, whatever the JSON.
#![no_main]

use std::path::Path;

use comminsight_import::kineto;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kineto::parse_reader(data, Path::new("fuzz.json"));
});
