//! Step templates over arbitrary text: `TemplateSet::parse` (TOML, then the template rules:
//! names, priorities, features, op patterns, phase rules) never panics; a file it accepts
//! becomes a set (`from_templates`), each template selects itself from its own required
//! features when its forbids allow, and runs a step state machine (`StepFsm`, what a rank's
//! step session drives) over an op stream: after the first NUL byte the input gives the ops
//! (role, function, size per op), else a fixed stream of every role and function. The machine
//! never panics and its summaries are ordered and consistent.
#![no_main]

use comminsight_agent::steps::fsm::StepFsm;
use comminsight_agent::steps::template::{Features, TemplateSet};
use comminsight_agent::steps::StepOp;
use comminsight_wire::names::Func;
use comminsight_wire::roles::Role;
use libfuzzer_sys::fuzz_target;

/// The op stream: 3 bytes an op (role, function, size), or a fixed cycle.
fn ops(spec: Option<&[u8]>) -> Vec<StepOp> {
    let triples: Vec<[u8; 3]> = match spec {
        Some(b) => b
            .chunks_exact(3)
            .take(2048)
            .map(|c| [c[0], c[1], c[2]])
            .collect(),
        None => (0..600u32)
            .map(|i| [(i % 7) as u8, (i * 5 % 13) as u8, (i * 11 % 29) as u8])
            .collect(),
    };
    let mut sn = [0u64; 16];
    let mut t = 1_000_000u64;
    triples
        .iter()
        .enumerate()
        .map(|(i, [r, f, s])| {
            let role = Role::ALL
                .get(usize::from(*r) % (Role::ALL.len() + 1))
                .copied();
            let comm = u64::from(*r % 16);
            sn[comm as usize] += 1;
            t += 10 + u64::from(*s) * 3;
            StepOp {
                comm_hash: 0x1000 + comm,
                role,
                func: Func(*f % 13),
                bytes: 1u64 << (*s % 34),
                coll_sn: sn[comm as usize],
                coll_local_sn: i as u64,
                start_us: t,
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let (text, spec) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let text = String::from_utf8_lossy(text);
    let Ok(v) = TemplateSet::parse("fuzz.toml", &text) else {
        return;
    };
    let Ok(set) = TemplateSet::from_templates(v) else {
        return;
    };
    assert!(set
        .templates
        .windows(2)
        .all(|w| w[0].priority > w[1].priority));
    let ops = ops(spec);
    for t in &set.templates {
        assert_eq!(set.get(&t.name).map(|x| &x.name), Some(&t.name));
        let f = Features::of(t.requires.iter().cloned());
        if t.satisfied_by(&f) {
            assert!(set.select(&f).is_some());
        }
        let mut fsm = StepFsm::new(t, 3);
        let mut out = Vec::new();
        for op in &ops {
            fsm.push(op, op.start_us + 5, &mut out);
        }
        for s in &out {
            assert_eq!(s.rank, 3);
        }
        assert!(out.windows(2).all(|w| w[0].step < w[1].step), "{out:?}");
    }
});
