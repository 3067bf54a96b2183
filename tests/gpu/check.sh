#!/usr/bin/env bash
# GPU check: our first contact with real NVML and real NCCL, on a machine with an NVIDIA GPU.
#   tests/gpu/check.sh            (from the repository root; about 2-4 minutes)
# On a machine without a GPU it says "no GPU", checks nothing and exits 0 (its dry run).
# Prints one summary table; exits 1 when a check fails. See tests/gpu/README.md.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${CHECK_OUT:-$(mktemp -d /tmp/comminsight-gpu-check.XXXXXX)}
mkdir -p "$OUT"
declare -a ROWS=()
FAILED=0
row() { ROWS+=("$(printf '%-28s %-5s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && FAILED=1; return 0; }
summary() {
  echo
  printf '%-28s %-5s %s\n' CHECK RESULT DETAIL
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo "(logs in $OUT)"
}

has_gpu() {
  [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
}
if ! has_gpu; then
  echo "no GPU (no /dev/nvidia0, nvidia-smi finds none): nothing checked"
  exit 0
fi

# 1. Build the agent and the plugin (no eBPF: not what this checks).
if COMMINSIGHT_NO_EBPF=1 cargo xtask build >"$OUT/build.log" 2>&1; then
  row build PASS "agent + plugin staged in target/debug/lib"
else
  row build FAIL "cargo xtask build failed (see $OUT/build.log)"; summary; exit 1
fi
AGENT=target/debug/comminsight-agent
PLUGIN=$PWD/target/debug/lib/libnccl-profiler-comminsight.so

# 2. doctor names NVML and the GPUs.
"$AGENT" doctor >"$OUT/doctor.txt" 2>&1
if grep -q '^\[ok  \] nvml' "$OUT/doctor.txt" && grep -q 'GPUs:' "$OUT/doctor.txt"; then
  row doctor PASS "$(grep -m1 'GPUs:' "$OUT/doctor.txt" | cut -c1-90)"
else
  row doctor FAIL "doctor does not report NVML with GPUs (see $OUT/doctor.txt)"
fi

# 3. Real NVML for 10 s: plausible values.
if "$AGENT" gpus --duration-s 10 --json >"$OUT/gpus.json" 2>"$OUT/gpus.err"; then
  if python3 - "$OUT/gpus.json" >"$OUT/gpus.check" 2>&1 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
assert r["devices"], "no device"
for s in r["samples"]:
    if not 0 <= s["sm_util"] <= 100: bad.append("sm_util %s" % s["sm_util"])
    if not 100 <= s["sm_clock_mhz"] <= 4000: bad.append("sm clock %s" % s["sm_clock_mhz"])
    if not 10 <= s["power_w"] <= 1500: bad.append("power %s W" % s["power_w"])
    if not 5 <= s["temperature_c"] <= 110: bad.append("temperature %s" % s["temperature_c"])
    if s["energy_mj"] <= 0: bad.append("no energy over the period")
    if not 0.9e9 <= s["interval_ns"] <= 1.5e9: bad.append("interval %s ns" % s["interval_ns"])
print("%d GPUs, %d NVLinks, %d metrics off: %s" % (len(r["devices"]), len(r["nvlinks"]), len(r["metrics_off"]), "; ".join(r["metrics_off"])[:200]))
if bad:
    print("implausible: " + ", ".join(bad)); sys.exit(1)
PY
  then row "nvml 10 s sample" PASS "$(head -c 90 "$OUT/gpus.check")"
  else row "nvml 10 s sample" FAIL "$(tail -1 "$OUT/gpus.check" | head -c 90)"; fi
else
  row "nvml 10 s sample" FAIL "$(head -c 90 "$OUT/gpus.err")"
fi

# 4. A real NCCL job: 2 processes all-reducing on the GPU(s) with our plugin.
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, torch.distributed as d; assert torch.cuda.is_available() and d.is_nccl_available()' 2>/dev/null; then
  "$PY" -m pip install --quiet torch >"$OUT/pip.log" 2>&1 || true
fi
if "$PY" -c 'import torch, torch.distributed as d; assert torch.cuda.is_available() and d.is_nccl_available()' 2>/dev/null; then
  cat >"$OUT/allreduce.py" <<'PY'
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local % torch.cuda.device_count())
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
for _ in range(50):
    dist.all_reduce(x)
torch.cuda.synchronize()
dist.destroy_process_group()
PY
  LOGS="$OUT/inspector_logs"
  if NCCL_PROFILER_PLUGIN="$PLUGIN" COMMINSIGHT_LOG_DIR="$LOGS" COMMINSIGHT_JOB_ID=gpucheck \
     timeout 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$OUT/allreduce.py" \
     >"$OUT/job.log" 2>&1; then
    row "nccl job" PASS "2 ranks x 50 all-reduces ($("$PY" -c 'import torch;print(torch.cuda.nccl.version())' 2>/dev/null))"
    "$AGENT" dump "$LOGS" --json >"$OUT/records.jsonl" 2>"$OUT/dump.err"
    if python3 - "$OUT/records.jsonl" >"$OUT/records.check" 2>&1 <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
colls = [r for r in recs if r["kind"] == "coll" and r.get("func") == "AllReduce"]
gpu = [r for r in colls if r.get("gpu_end_ns", 0) > r.get("gpu_start_ns", 0) > 0]
devs = [r for r in recs if r["kind"] == "comm_device"]
bound = {(r["rank"], r["device"], r["pci"]) for r in devs if r["pci"] and r["device"] >= 0}
print("%d all-reduce records (%d with GPU timers), devices %s" % (len(colls), len(gpu), sorted(bound)))
ok = len(colls) >= 100 and len(gpu) > 0 and len({b[0] for b in bound}) == 2
sys.exit(0 if ok else 1)
PY
    then row "records" PASS "$(head -c 90 "$OUT/records.check")"
    else row "records" FAIL "$(head -c 90 "$OUT/records.check")"; fi
  else
    row "nccl job" FAIL "torchrun failed (see $OUT/job.log)"
  fi
else
  row "nccl job" SKIP "no PyTorch with CUDA and NCCL here (pip install torch failed or offline)"
fi

summary
exit $FAILED
