//! The streaming reader: serde visitors over the top-level object and the `traceEvents` array,
//! one event at a time, keeping only NCCL kernels (compact) and `ProfilerStep#N` ranges.
//!
//! Every value is read leniently ([`Loose`]): a field of an unexpected type is treated as
//! absent instead of failing the whole file.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::loose::Loose;
use super::names;
use super::{CommKey, Kernel, KinetoTrace, StepRange};

/// The keys of an event this reader looks at.
#[derive(Deserialize)]
#[serde(field_identifier)]
enum EvKey {
    #[serde(rename = "name")]
    Name,
    #[serde(rename = "cat")]
    Cat,
    #[serde(rename = "ts")]
    Ts,
    #[serde(rename = "dur")]
    Dur,
    #[serde(rename = "pid")]
    Pid,
    #[serde(rename = "args")]
    Args,
    #[serde(other)]
    Other,
}

/// The `args` keys of a kernel event this reader looks at.
#[derive(Deserialize)]
#[serde(field_identifier)]
enum ArgKey {
    #[serde(rename = "stream")]
    Stream,
    #[serde(rename = "device")]
    Device,
    #[serde(rename = "Collective name")]
    Coll,
    #[serde(rename = "In msg nelems")]
    Nelems,
    #[serde(rename = "Group size")]
    GroupSize,
    #[serde(rename = "dtype")]
    Dtype,
    #[serde(rename = "Process Group Name")]
    PgName,
    #[serde(rename = "Process Group Description")]
    PgDesc,
    #[serde(rename = "Process Group Ranks")]
    PgRanks,
    #[serde(other)]
    Other,
}

/// One event, the fields this reader uses.
#[derive(Default)]
struct Event {
    name: Loose,
    cat: Loose,
    ts: Loose,
    dur: Loose,
    pid: Loose,
    args: Args,
}

#[derive(Default)]
struct Args {
    stream: Loose,
    device: Loose,
    coll: Loose,
    nelems: Loose,
    group_size: Loose,
    dtype: Loose,
    pg_name: Loose,
    pg_desc: Loose,
    pg_ranks: Loose,
}

/// Reads a map, or anything else as an empty value.
macro_rules! lenient_map {
    ($ty:ident, $vis:ident, $key:ident, |$v:ident, $k:ident, $map:ident| $body:block) => {
        struct $vis;
        impl<'de> Visitor<'de> for $vis {
            type Value = $ty;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut $map: A) -> Result<$ty, A::Error> {
                let mut $v = $ty::default();
                while let Some($k) = $map.next_key::<$key>()? $body
                Ok($v)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<$ty, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok($ty::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<$ty, E> { Ok($ty::default()) }
            fn visit_i64<E>(self, _: i64) -> Result<$ty, E> { Ok($ty::default()) }
            fn visit_u64<E>(self, _: u64) -> Result<$ty, E> { Ok($ty::default()) }
            fn visit_f64<E>(self, _: f64) -> Result<$ty, E> { Ok($ty::default()) }
            fn visit_str<E>(self, _: &str) -> Result<$ty, E> { Ok($ty::default()) }
            fn visit_unit<E>(self) -> Result<$ty, E> { Ok($ty::default()) }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                d.deserialize_any($vis)
            }
        }
    };
}

lenient_map!(Args, ArgsVisitor, ArgKey, |a, k, map| {
    let slot = match k {
        ArgKey::Stream => &mut a.stream,
        ArgKey::Device => &mut a.device,
        ArgKey::Coll => &mut a.coll,
        ArgKey::Nelems => &mut a.nelems,
        ArgKey::GroupSize => &mut a.group_size,
        ArgKey::Dtype => &mut a.dtype,
        ArgKey::PgName => &mut a.pg_name,
        ArgKey::PgDesc => &mut a.pg_desc,
        ArgKey::PgRanks => &mut a.pg_ranks,
        ArgKey::Other => {
            map.next_value::<IgnoredAny>()?;
            continue;
        }
    };
    *slot = map.next_value()?;
});

lenient_map!(Event, EventVisitor, EvKey, |e, k, map| {
    match k {
        EvKey::Name => e.name = map.next_value()?,
        EvKey::Cat => e.cat = map.next_value()?,
        EvKey::Ts => e.ts = map.next_value()?,
        EvKey::Dur => e.dur = map.next_value()?,
        EvKey::Pid => e.pid = map.next_value()?,
        EvKey::Args => e.args = map.next_value()?,
        EvKey::Other => {
            map.next_value::<IgnoredAny>()?;
        }
    }
});

/// `distributedInfo`: the keys used.
#[derive(Default)]
pub(super) struct DistInfo {
    pub rank: Loose,
    pub world_size: Loose,
    pub hostname: Loose,
}

#[derive(Deserialize)]
#[serde(field_identifier)]
enum DistKey {
    #[serde(rename = "rank")]
    Rank,
    #[serde(rename = "world_size")]
    World,
    #[serde(rename = "hostname")]
    Host,
    #[serde(other)]
    Other,
}

lenient_map!(DistInfo, DistVisitor, DistKey, |d, k, map| {
    match k {
        DistKey::Rank => d.rank = map.next_value()?,
        DistKey::World => d.world_size = map.next_value()?,
        DistKey::Host => d.hostname = map.next_value()?,
        DistKey::Other => {
            map.next_value::<IgnoredAny>()?;
        }
    }
});

#[derive(Deserialize)]
#[serde(field_identifier)]
enum TopKey {
    #[serde(rename = "traceEvents")]
    Events,
    #[serde(rename = "distributedInfo")]
    Dist,
    #[serde(rename = "baseTimeNanoseconds")]
    Base,
    #[serde(rename = "schemaVersion")]
    Schema,
    #[serde(other)]
    Other,
}

/// Collects into a [`KinetoTrace`] as it reads, so that what was read before an error is kept.
pub(super) struct Collector<'a> {
    pub trace: &'a mut KinetoTrace,
    pub comm_index: HashMap<CommKey, u32>,
}

/// The top-level object.
pub(super) struct TopSeed<'a, 'b>(pub &'b mut Collector<'a>);

impl<'de> DeserializeSeed<'de> for TopSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kineto trace object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(k) = map.next_key::<TopKey>()? {
            match k {
                TopKey::Events => {
                    self.0.trace.has_events = true;
                    map.next_value_seed(EventsSeed(&mut *self.0))?;
                }
                TopKey::Dist => {
                    let d: DistInfo = map.next_value()?;
                    let t = &mut *self.0.trace;
                    t.rank = d
                        .rank
                        .as_i64()
                        .and_then(|r| i32::try_from(r).ok())
                        .unwrap_or(-1);
                    t.world = d
                        .world_size
                        .as_i64()
                        .and_then(|r| i32::try_from(r).ok())
                        .unwrap_or(-1);
                    t.hostname = d
                        .hostname
                        .as_str()
                        .map(str::to_string)
                        .filter(|h| !h.is_empty());
                }
                TopKey::Base => {
                    let b: Loose = map.next_value()?;
                    self.0.trace.base_ns = b.as_u64();
                }
                TopKey::Schema => {
                    let v: Loose = map.next_value()?;
                    self.0.trace.schema_version = Some(v.as_i64().unwrap_or(-1));
                }
                TopKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// The `traceEvents` array, element by element.
struct EventsSeed<'a, 'b>(&'b mut Collector<'a>);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the traceEvents array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(ev) = seq.next_element::<Event>()? {
            self.0.trace.events += 1;
            self.0.event(ev);
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom("traceEvents is not an array"))
    }
}

const NCCL_PREFIXES: [&str; 2] = ["ncclKernel_", "ncclDevKernel_"];

impl Collector<'_> {
    fn event(&mut self, ev: Event) {
        let Some(name) = ev.name.as_str() else { return };
        if let Some(n) = name.strip_prefix("ProfilerStep#") {
            self.step(n, &ev);
        } else if NCCL_PREFIXES.iter().any(|p| name.starts_with(p))
            && ev.cat.as_str() == Some("kernel")
        {
            self.kernel(name, &ev);
        }
    }

    fn step(&mut self, n: &str, ev: &Event) {
        let (Some(step), Some(ts), Some(dur)) = (
            n.trim().parse::<u64>().ok(),
            ev.ts.us_to_ns(),
            ev.dur.us_to_ns(),
        ) else {
            self.trace
                .skips
                .add("ProfilerStep event without a step number, ts or dur", 1);
            return;
        };
        let gpu = ev.cat.as_str().is_some_and(|c| c.contains("gpu"));
        if !gpu {
            if let Some(p) = ev.pid.as_i64() {
                self.trace.cpu_pid.get_or_insert(p);
            }
        }
        if dur < 0 || self.trace.steps.len() >= super::MAX_STEPS {
            self.trace.skips.add(
                "ProfilerStep range with a negative duration or beyond the limit",
                1,
            );
            return;
        }
        self.trace.steps.push(StepRange {
            step,
            gpu,
            start: ts,
            dur: dur as u64,
        });
    }

    fn kernel(&mut self, name: &str, ev: &Event) {
        let a = &ev.args;
        let func = match a.coll.as_str() {
            Some(c) => names::func_from_collective(c).or_else(|| names::func_from_kernel(name)),
            None => names::func_from_kernel(name),
        };
        let Some(func) = func else {
            self.trace
                .skips
                .add("NCCL kernel with no known collective", 1);
            return;
        };
        let (Some(start), Some(dur)) = (ev.ts.us_to_ns(), ev.dur.us_to_ns()) else {
            self.trace.skips.add("NCCL kernel without ts or dur", 1);
            return;
        };
        if !(0..1 << 50).contains(&dur) {
            self.trace
                .skips
                .add("NCCL kernel with a negative or huge duration", 1);
            return;
        }
        let dtype = match a.dtype.as_str().map(names::dtype_from_torch) {
            Some(d) if d.0 != 0 => d,
            _ => names::dtype_from_kernel(name),
        };
        let (algo, proto) = names::algo_proto_from_kernel(name);
        let device = a
            .device
            .as_i64()
            .and_then(|d| i32::try_from(d).ok())
            .filter(|d| (0..1 << 20).contains(d));
        let Some(comm) = self.comm(a, device) else {
            self.trace
                .skips
                .add("NCCL kernel with neither a process group nor a stream", 1);
            return;
        };
        if let Some(p) = ev.pid.as_i64() {
            self.trace.gpu_pid.get_or_insert(p);
        }
        self.trace.kernels.push(Kernel {
            start,
            dur: dur as u64,
            count: a.nelems.as_u64().unwrap_or(0),
            comm,
            device: device.unwrap_or(-1),
            func,
            dtype,
            algo,
            proto,
        });
    }

    fn comm(&mut self, a: &Args, device: Option<i32>) -> Option<u32> {
        let key = if let Some(name) = a.pg_name.to_name() {
            let ranks = match &a.pg_ranks {
                Loose::Ints(v) => Some(v.clone()),
                Loose::Str(s) => parse_ranks(s),
                _ => None,
            };
            CommKey::Pg {
                name,
                desc: a.pg_desc.to_name().unwrap_or_default(),
                ranks,
                size: a.group_size.as_u64(),
            }
        } else {
            let stream = a.stream.as_i64()?;
            CommKey::Stream {
                stream,
                device: device.unwrap_or(-1),
            }
        };
        if let Some(i) = self.comm_index.get(&key) {
            return Some(*i);
        }
        if self.trace.comms.len() >= super::MAX_COMMS {
            return None;
        }
        let i = self.trace.comms.len() as u32;
        self.trace.comms.push(key.clone());
        self.comm_index.insert(key, i);
        Some(i)
    }
}

/// `"[0, 1, 2]"` (PyTorch's `Process Group Ranks`) as integers.
fn parse_ranks(s: &str) -> Option<Vec<i64>> {
    let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    if inner.trim().is_empty() {
        return Some(Vec::new());
    }
    inner
        .split(',')
        .take(super::MAX_PG_RANKS)
        .map(|t| t.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_numbers_and_ranks() {
        assert_eq!(
            Loose::Float(4458677009853.422).us_to_ns(),
            Some(4_458_677_009_853_422)
        );
        assert_eq!(
            Loose::Int(1683564902174220).us_to_ns(),
            Some(1_683_564_902_174_220_000)
        );
        assert_eq!(Loose::Float(30669.0).us_to_ns(), Some(30_669_000));
        assert_eq!(Loose::Float(f64::NAN).us_to_ns(), None);
        assert_eq!(parse_ranks("[0, 1]"), Some(vec![0, 1]));
        assert_eq!(parse_ranks("[]"), Some(vec![]));
        assert_eq!(parse_ranks("[a]"), None);
    }
}
