#!/usr/bin/env bash
# Agent CPU time and peak RSS while the test bed runs 8 real rank processes on this host, with
# the eBPF host probes on (sched + TCP + ibverbs uprobes, the host stream written) against the
# same run with `[probes] enabled = false` (thread states from /proc schedstat), in one session:
# the arms alternate (on, off, on, off, ...) so that drift on a noisy machine hits both alike.
#
# Usage (root; after `cargo xtask build-ebpf` and `cargo build --workspace --bins` with
# COMMINSIGHT_BPF_OBJECT set, so that the agent embeds the BPF object):
#   tests/bench/agent_host_overhead.sh [ROUNDS (default 3)] [STEPS (default 400)]
# ARMS="on off no-tcp no-sched" adds arms with only the TCP or only the scheduler probes off
# (to attribute the cost); the default is "on off".
# Prints one line per run (arm, agent user+system CPU seconds, agent peak RSS MiB, test-bed wall
# seconds, the test bed's and its ranks' CPU seconds (where the probes' kernel time on their
# context switches lands), host-stream bytes) and the medians per arm with their ratios. Issue 19's numbers in
# BENCHMARKS.md come from this script.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${COMMINSIGHT_BIN_DIR:-$root/target/debug}
lib=${COMMINSIGHT_LIB_DIR:-$root/target/debug/lib}
rounds=${1:-3}
steps=${2:-400}
[ "$(id -u)" = 0 ] || { echo "agent_host_overhead.sh: needs root (eBPF)" >&2; exit 2; }
for f in "$bin/comminsight-agent" "$bin/comminsight-testbed" "$lib"; do
    [ -e "$f" ] || { echo "agent_host_overhead.sh: $f missing (cargo build --workspace --bins)" >&2; exit 2; }
done
out=$(mktemp -d /tmp/comminsight-host-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
tick=$(getconf CLK_TCK)

# One run of arm $1 (on|off), number $2: prints "arm cpu_s rss_mib wall_s host_bytes".
run_one() {
    local arm=$1 i=$2 d="$out/$1-$2" probes="enabled = true"
    case $arm in
        off) probes="enabled = false" ;;
        no-tcp) probes="enabled = true
tcp = false" ;;
        no-sched) probes="enabled = true
sched = false" ;;
    esac
    mkdir -p "$d/shm" "$d/run/inspector_logs"
    cat > "$d/agent.toml" <<EOF
[agent]
state_dir = "$d/state"
host_name = "host0"
[sources]
shm_dir = "$d/shm"
segment_dirs = ["$d/run/inspector_logs"]
[master]
listen = ""
[archive]
enabled = false
[probes]
$probes
EOF
    COMMINSIGHT_HTTP_LISTEN=127.0.0.1:0 "$bin/comminsight-agent" run --config "$d/agent.toml" \
        > "$d/agent.log" 2>&1 &
    local agent=$!
    sleep 2
    local t0 t1 ranks_cpu
    t0=$(date +%s.%N)
    # The test bed's and its ranks' user + system CPU (bash `time`: the waited-for children).
    ranks_cpu=$( { TIMEFORMAT='%U %S'; time COMMINSIGHT_LIB_DIR=$lib COMMINSIGHT_SHM_DIR="$d/shm" \
        "$bin/comminsight-testbed" run --out "$d/run" --scenario "$root/tests/scenarios/ddp.toml" \
        --ranks 8 --hosts 1 --steps "$steps" --timeout 600 > "$d/testbed.log" 2>&1; } 2>&1 \
        | awk '{ printf "%.2f", $1 + $2 }')
    t1=$(date +%s.%N)
    sleep 2
    # utime + stime (fields 14, 15 of /proc/PID/stat, after the command name) and VmHWM.
    local stat cpu hwm bytes
    stat=$(sed 's/^.*) //' "/proc/$agent/stat")
    cpu=$(echo "$stat" | awk -v t="$tick" '{ printf "%.2f", ($12 + $13) / t }')
    hwm=$(awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$agent/status")
    kill -TERM "$agent"
    wait "$agent" || true
    if [ "$arm" != off ] && ! grep -q 'ebpf=on' "$d/agent.log"; then
        echo "agent_host_overhead.sh: the probes did not load: $(grep -m1 'eBPF' "$d/agent.log")" >&2
        exit 1
    fi
    bytes=$(du -sb "$d/state/host-streams" 2>/dev/null | cut -f1)
    printf '%s %s %s %s %s %s\n' "$arm" "$cpu" "$hwm" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "$ranks_cpu" "${bytes:-0}"
    rm -rf "$d"
}

echo "arm agent_cpu_s agent_peak_rss_mib testbed_wall_s testbed_and_ranks_cpu_s host_stream_bytes"
results=()
for i in $(seq 1 "$rounds"); do
    for arm in ${ARMS:-on off}; do
        line=$(run_one "$arm" "$i")
        echo "$line"
        results+=("$line")
    done
done
printf '%s\n' "${results[@]}" | awk '
    { cpu[$1] = cpu[$1] " " $2; rss[$1] = rss[$1] " " $3; wall[$1] = wall[$1] " " $4; rk[$1] = rk[$1] " " $5 }
    function median(s,   a, n, i, j, t) {
        n = split(s, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
        for (arm in cpu) printf "median %s: agent cpu %.2f s, agent peak RSS %.1f MiB, test bed %.2f s wall, %.2f s cpu (ranks)\n", arm, median(cpu[arm]), median(rss[arm]), median(wall[arm]), median(rk[arm])
        printf "ratio on/off: agent cpu %.2f, agent peak RSS %.2f, test bed wall %.2f, ranks cpu %.2f\n", median(cpu["on"]) / median(cpu["off"]), median(rss["on"]) / median(rss["off"]), median(wall["on"]) / median(wall["off"]), median(rk["on"]) / median(rk["off"])
    }'
