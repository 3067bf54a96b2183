#!/usr/bin/env bash
# The Kineto importer on a synthetic trace of SIZE MiB (default 1024): peak RSS (GNU time's
# "Maximum resident set size") and the import rate in MB/s, plain and gzip, ROUNDS times each
# (default 3), plus the medians. Issue 22's numbers in BENCHMARKS.md come from this script.
# Usage (after `cargo build --workspace --bins`): tests/bench/import_kineto.sh [SIZE_MIB] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${COMMINSIGHT_BIN_DIR:-$root/target/debug}
size=${1:-1024}
rounds=${2:-3}
[ -x /usr/bin/time ] || { echo "import_kineto.sh: needs GNU time (apt-get install time)" >&2; exit 2; }
work=$(mktemp -d /tmp/comminsight-import-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 "$root/tests/bench/kineto_synth.py" "$work/trace.json" "$size" > "$work/plain.meta"
python3 "$root/tests/bench/kineto_synth.py" "$work/trace.json.gz" "$size" --gzip > "$work/gz.meta"
echo "generated: plain $(cat "$work/plain.meta"), gzip $(cat "$work/gz.meta") ($(stat -c %s "$work/trace.json.gz") bytes compressed)"
for arm in plain gz; do
    f=$work/trace.json; [ $arm = gz ] && f=$work/trace.json.gz
    json_bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$work/$arm.meta")
    for i in $(seq "$rounds"); do
        rm -rf "$work/out"
        /usr/bin/time -f "%e %M" -o "$work/time" "$bin/comminsight-agent" import kineto "$f" -o "$work/out" --json > "$work/m.json"
        read -r secs kib < "$work/time"
        ops=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["ops"])' "$work/m.json")
        awk -v a=$arm -v s="$secs" -v k="$kib" -v b="$json_bytes" -v o="$ops" 'BEGIN {
            printf "%s run: %.2f s, peak RSS %.1f MiB, %.1f MB/s of JSON, %d ops\n", a, s, k/1024, b/1e6/s, o }' | tee -a "$work/$arm.runs"
    done
done
for arm in plain gz; do
    python3 - "$arm" "$work/$arm.runs" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[2])]
col = lambda i: statistics.median(float(r[i]) for r in rows)
print(f"{sys.argv[1]} median of {len(rows)}: {col(2):.2f} s, peak RSS {col(6):.1f} MiB, {col(8):.1f} MB/s")
PY
done
