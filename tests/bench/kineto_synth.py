#!/usr/bin/env python3
"""Write a synthetic Kineto / Chrome JSON trace of about SIZE bytes, shaped like torch.profiler's
(schemaVersion, distributedInfo, deviceProperties, traceEvents, baseTimeNanoseconds at the end):
per step one ProfilerStep#N range and, per layer, CPU ops, CUDA runtime calls, compute kernels and
NCCL kernels with the newer metadata (collective name, element counts, dtype, process group).
Usage: kineto_synth.py OUT.json [SIZE_MB (default 1024)] [--gzip]. Prints the NCCL kernel and step
counts it wrote, for the import benchmark (tests/bench/import_kineto.sh)."""
import gzip
import json
import sys


def main():
    out = sys.argv[1]
    size = int(sys.argv[2]) * (1 << 20) if len(sys.argv) > 2 and sys.argv[2] != "--gzip" else 1 << 30
    opener = gzip.open if "--gzip" in sys.argv else open
    head = {"schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8,
                                               "ranks": list(range(8))}]},
            "deviceProperties": [{"id": 0, "name": "stand-in GPU", "totalGlobalMem": 85899345920}]}
    written = 0
    kernels = 0
    steps = 0
    ts = 1_000_000.0
    corr = 0
    with opener(out, "wt") as f:
        text = json.dumps(head)[:-1] + ', "traceEvents": [\n'
        f.write(text)
        written += len(text)
        first = True
        while written < size:
            step_start = ts
            events = []
            for layer in range(32):
                for op in ("aten::linear", "aten::mm", "aten::add_", "aten::gelu"):
                    corr += 1
                    events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 4242, "tid": 4242,
                                   "ts": ts, "dur": 12.5,
                                   "args": {"External id": corr, "Record function id": 0, "Sequence number": corr,
                                            "Fwd thread id": 0, "Input Dims": [[4096, 4096], [4096, 4096]],
                                            "Input type": ["c10::BFloat16", "c10::BFloat16"]}})
                    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242,
                                   "tid": 4242, "ts": ts + 1, "dur": 4.0,
                                   "args": {"External id": corr, "cbid": 211, "correlation": corr}})
                    events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32",
                                   "pid": 0, "tid": 7, "ts": ts + 20, "dur": 55.0,
                                   "args": {"External id": corr, "queued": 0, "device": 0, "context": 1,
                                            "stream": 7, "correlation": corr, "registers per thread": 168,
                                            "grid": [132, 1, 1], "block": [384, 1, 1]}})
                    ts += 60
                corr += 1
                events.append({"ph": "X", "cat": "kernel",
                               "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                               "pid": 0, "tid": 20, "ts": ts, "dur": 180.0,
                               "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 20,
                                        "correlation": corr, "Collective name": "allreduce",
                                        "In msg nelems": 4194304, "Out msg nelems": 4194304, "Group size": 8,
                                        "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
                                        "Process Group Name": "0", "Process Group Description": "default_pg",
                                        "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}})
                kernels += 1
                ts += 200
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{steps}", "pid": 4242,
                           "tid": 4242, "ts": step_start - 5, "dur": ts - step_start + 10, "args": {}})
            steps += 1
            ts += 1000
            for e in events:
                text = ("" if first else ",\n") + json.dumps(e)
                first = False
                f.write(text)
                written += len(text)
        tail = '\n], "traceName": "synthetic", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}\n'
        f.write(tail)
    print(json.dumps({"nccl_kernels": kernels, "steps": steps, "bytes": written + len(tail)}))


if __name__ == "__main__":
    main()
