"""Facts about a Perfetto trace, read with Perfetto's own protobuf schema (PyPI `perfetto`).

Usage: trace_facts.py FILE.pftrace -> one JSON object on stdout (see the keys at the end).
Checks made here are reported, not asserted: the Rust test asserts on them.
"""
import json
import sys
from collections import defaultdict

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

PHASES = {"forward", "backward", "grad_sync", "optimizer"}
OP_ARGS = ["role", "comm", "comm_name", "func", "seq", "bytes", "count", "algo", "proto", "start_us", "end_us"]


def main(path):
    with open(path, "rb") as f:
        trace = pb.Trace.FromString(f.read())
    processes, threads, children, counters = {}, {}, {}, {}
    names, arg_names, arg_strings = {}, {}, {}
    problems = []
    # Per track: open slices [(name, ts, kind)], last timestamp.
    stacks = defaultdict(list)
    counter_values = defaultdict(list)
    last_ts = defaultdict(int)
    slices = []  # (track, name, kind, parent kind, begin, end, args, flows)
    instants = []  # (track, name, ts)
    open_args = defaultdict(list)
    seq_cleared = False
    for i, p in enumerate(trace.packet):
        if p.sequence_flags & 1:
            seq_cleared = True
            names.clear(), arg_names.clear(), arg_strings.clear()
        if p.HasField("interned_data"):
            if not seq_cleared:
                problems.append(f"packet {i}: interned data before SEQ_INCREMENTAL_STATE_CLEARED")
            for e in p.interned_data.event_names:
                names[e.iid] = e.name
            for e in p.interned_data.debug_annotation_names:
                arg_names[e.iid] = e.name
            for e in p.interned_data.debug_annotation_string_values:
                arg_strings[e.iid] = e.str.decode()
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("process"):
                processes[d.uuid] = {"pid": d.process.pid, "name": d.process.process_name}
            elif d.HasField("thread"):
                threads[d.uuid] = {"pid": d.thread.pid, "tid": d.thread.tid,
                                   "name": d.thread.thread_name, "parent": d.parent_uuid}
            elif d.HasField("counter"):
                counters[d.uuid] = {"name": d.name, "parent": d.parent_uuid}
            else:
                children[d.uuid] = {"name": d.name, "parent": d.parent_uuid}
            continue
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        t = e.track_uuid
        if t not in threads and t not in children and t not in counters:
            problems.append(f"packet {i}: event on undeclared track {t}")
        if p.timestamp < last_ts[t]:
            problems.append(f"packet {i}: timestamp goes back on track {t}")
        last_ts[t] = p.timestamp
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            name = e.name if e.HasField("name") else names.get(e.name_iid)
            if name is None:
                problems.append(f"packet {i}: unknown name iid {e.name_iid}")
            args = {}
            for a in e.debug_annotations:
                k = a.name if a.HasField("name") else arg_names.get(a.name_iid)
                if k is None:
                    problems.append(f"packet {i}: unknown argument name iid {a.name_iid}")
                    continue
                v = a.WhichOneof("value")
                args[k] = arg_strings.get(a.string_value_iid) if v == "string_value_iid" else getattr(a, v)
            if name and name.startswith("step "):
                kind = "step"
            elif name in PHASES:
                kind = "phase"
            else:
                kind = "op"
            parent = stacks[t][-1][2] if stacks[t] else None
            stacks[t].append((name, p.timestamp, kind, args, list(e.flow_ids), parent))
        elif e.type == pb.TrackEvent.TYPE_INSTANT:
            instants.append((t, e.name if e.HasField("name") else names.get(e.name_iid), p.timestamp))
        elif e.type == pb.TrackEvent.TYPE_COUNTER:
            v = e.double_counter_value if e.HasField("double_counter_value") else e.counter_value
            counter_values[t].append(v)
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            if not stacks[t]:
                problems.append(f"packet {i}: SLICE_END without a BEGIN on track {t}")
                continue
            name, b, kind, args, flows, parent = stacks[t].pop()
            slices.append({"track": t, "name": name, "kind": kind, "parent": parent,
                           "begin": b, "end": p.timestamp, "args": args, "flows": flows})
    for t, st in stacks.items():
        if st:
            problems.append(f"track {t}: {len(st)} slices never end")

    def rank_of(track):
        if track in threads:
            return int(threads[track]["name"].split()[1])
        if track in children:
            return rank_of(children[track]["parent"])
        return None

    # Nesting rules: steps on thread tracks at the top; phases in steps; ops in phases or steps
    # on thread tracks, at the top of child tracks.
    for s in slices:
        on_thread = s["track"] in threads
        want = {"step": {None}, "phase": {"step"}, "op": {"phase", "step"} if on_thread else {None}}
        if s["kind"] == "step" and not on_thread:
            problems.append(f"step slice on a child track {s['track']}")
        if s["parent"] not in want[s["kind"]]:
            problems.append(f"{s['kind']} {s['name']} under {s['parent']} on track {s['track']}")
        if s["end"] < s["begin"]:
            problems.append(f"slice {s['name']} ends before it begins")
    steps_per_rank = defaultdict(list)
    ops, ops_missing_args, flow_slices = 0, 0, defaultdict(list)
    phases = 0
    for s in slices:
        r = rank_of(s["track"])
        if s["kind"] == "step":
            steps_per_rank[r].append(s["args"].get("step"))
        elif s["kind"] == "phase":
            phases += 1
        else:
            ops += 1
            if any(k not in s["args"] for k in OP_ARGS):
                ops_missing_args += 1
            for f in s["flows"]:
                flow_slices[f].append(r)
    flows_bad = sum(1 for v in flow_slices.values() if len(v) < 2 or len(set(v)) < 2)
    out = {
        "packets": len(trace.packet),
        "processes": sorted(p["name"] for p in processes.values()),
        "threads": sorted(th["name"] for th in threads.values()),
        "threads_under_processes": all(th["parent"] in processes and
                                       processes[th["parent"]]["pid"] == th["pid"]
                                       for th in threads.values()),
        "child_tracks": len(children),
        "steps_per_rank": {str(k): sorted(v) for k, v in steps_per_rank.items()},
        "phases": phases,
        "ops": ops,
        "ops_missing_args": ops_missing_args,
        "op_names": sorted({s["name"] for s in slices if s["kind"] == "op"}),
        "flows": len(flow_slices),
        "flows_bad": flows_bad,
        "flow_slices": sum(len(v) for v in flow_slices.values()),
        "min_ts_us": min((s["begin"] for s in slices), default=0) // 1000,
        "max_ts_us": max((s["end"] for s in slices), default=0) // 1000,
        # Counter tracks: name (the rank prefix removed), rank (None: a host's), values, max.
        "counter_tracks": [{"name": c["name"].split(" · ", 1)[-1],
                            "rank": rank_of(c["parent"]),
                            "values": len(counter_values[u]),
                            "max": max(counter_values[u], default=0)}
                           for u, c in sorted(counters.items())],
        # Instants: the name of their track, their name, µs.
        "instants": [{"track": (children.get(t) or threads.get(t) or {}).get("name"),
                      "name": n, "ts_us": ts // 1000} for t, n, ts in instants],
        "problems": problems[:20],
        "problem_count": len(problems),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
