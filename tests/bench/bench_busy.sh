#!/usr/bin/env bash
# The training step on a quiet machine and beside one busy process (`yes`, unpinned and pinned
# to one core), at 1 and 2 threads. Runs alternate and repeat; each figure is the best of the
# repeats' medians (the machine is shared: the least disturbed run is the one to compare).
#
#   tests/bench/bench_busy.sh [BUILD_DIR] [REPEATS] [SEQ_LEN] [ADAM_IMPL]
set -euo pipefail
build=${1:-build}
reps=${2:-3}
seq=${3:-25}
impl=${4:-fused}
membill="$build/examples/membill/membill"
[ -x "$membill" ] || { echo "bench_busy.sh: $membill is missing: build the project first" >&2; exit 1; }
tmp=$(mktemp -d)
busy=
trap '[ -n "$busy" ] && kill $busy 2>/dev/null; rm -rf "$tmp"' EXIT

step() { # threads -> median step seconds of steps 2..5
  "$membill" train --steps 5 --threads "$1" --seq-len "$seq" --adam-impl "$impl" --quiet --json "$tmp/r.json"
  python3 -c "import json,statistics,sys; s=json.load(open(sys.argv[1]))['timing']['steps'][1:]; print(statistics.median(x['step_s'] for x in s))" "$tmp/r.json"
}
start_busy() { # "" | "pinned"
  if [ "$1" = pinned ]; then taskset -c 0 yes >/dev/null & else yes >/dev/null & fi
  busy=$!
}
stop_busy() { kill "$busy" 2>/dev/null; wait "$busy" 2>/dev/null || true; busy=; }

for r in $(seq "$reps"); do
  for t in 1 2; do
    echo "quiet $t $(step $t)" >>"$tmp/all"
    start_busy ""; echo "busy $t $(step $t)" >>"$tmp/all"; stop_busy
    start_busy pinned; echo "pinned $t $(step $t)" >>"$tmp/all"; stop_busy
  done
done
python3 - "$tmp/all" "$seq" "$impl" <<'PY'
import sys, collections
best = collections.defaultdict(lambda: float("inf"))
for line in open(sys.argv[1]):
    k, t, s = line.split()
    best[(k, int(t))] = min(best[(k, int(t))], float(s))
print(f"SmolLM2-135M train step, 1 x {sys.argv[2]} tokens, Adam {sys.argv[3]}: best of the repeats' medians (s)")
print(f"{'machine':<28} {'1 thread':>9} {'2 threads':>10} {'2 / quiet 2':>12} {'2 / same 1':>11}")
q2 = best[("quiet", 2)]
for k, name in (("quiet", "quiet"), ("busy", "one busy process"), ("pinned", "one busy process on core 0")):
    b1, b2 = best[(k, 1)], best[(k, 2)]
    print(f"{name:<28} {b1:>9.3f} {b2:>10.3f} {b2 / q2:>12.2f} {b2 / b1:>11.2f}")
ok = all(best[(k, 2)] <= 1.3 * q2 and best[(k, 2)] <= best[(k, 1)] for k in ("busy", "pinned"))
print("target (busy 2 threads <= 1.3 x quiet 2 threads, and <= busy 1 thread):", "met" if ok else "NOT met")
PY
