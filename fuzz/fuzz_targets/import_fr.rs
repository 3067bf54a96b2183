//! Flight Recorder dumps over arbitrary bytes: the pickle reader never panics and never runs
//! anything (it has nothing that could), a dump it accepts (pickle or JSON) becomes a hang
//! snapshot, and the analysis of that snapshot never panics either.
#![no_main]

use std::path::Path;

use comminsight_agent::hang::{analyze, HangSettings};
use comminsight_agent::interop::fr_snapshot::snapshot;
use comminsight_import::{flight_recorder, pickle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = pickle::parse(data) {
        let _ = v.to_json();
    }
    let Ok((dump, _skips)) = flight_recorder::parse_dump(data, Path::new("fuzz/_dump_3")) else {
        return;
    };
    let snap = snapshot("fuzz", std::slice::from_ref(&dump));
    let _ = analyze(&snap, &HangSettings::default(), &[]);
});
