#!/usr/bin/env bash
# The profiler's own cost: the SmolLM2-135M training step (fused Adam) with the profiler's
# bookkeeping (the normal build) against the same step in a build that allocates straight from
# jemalloc without it (-DMEMBILL_BARE_ALLOC=ON: no lock, no site, no count, no hooks on plain
# malloc). Runs alternate; each figure is the best of the repeats' medians.
#
#   tests/bench/bench_overhead.sh [BUILD_DIR] [BARE_BUILD_DIR] [REPEATS] [SEQ_LEN]
#
# BARE_BUILD_DIR (default build-bare) is configured and built when it has no membill yet.
set -euo pipefail
build=${1:-build}
bare=${2:-build-bare}
reps=${3:-5}
seq=${4:-25}
here=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "$build/examples/membill/membill" ] || { echo "bench_overhead.sh: build $build first" >&2; exit 1; }
if [ ! -x "$bare/examples/membill/membill" ]; then
  cmake -S "$here" -B "$bare" -DMEMBILL_BARE_ALLOC=ON >/dev/null
  cmake --build "$bare" -j2 --target membill >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$reps"); do
  for b in "$build" "$bare"; do
    "$b/examples/membill/membill" train --steps 5 --seq-len "$seq" --adam-impl fused --quiet --json "$tmp/r.json"
    /usr/bin/python3 -c "import json,statistics,sys; s=json.load(open(sys.argv[1]))['timing']['steps'][1:]; print(sys.argv[2], statistics.median(x['step_s'] for x in s))" "$tmp/r.json" "$b" >>"$tmp/all"
  done
done
/usr/bin/python3 - "$tmp/all" "$build" "$bare" "$seq" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    b, s = line.split()
    best[b] = min(best.get(b, float("inf")), float(s))
prof, bare = best[sys.argv[2]], best[sys.argv[3]]
print(f"SmolLM2-135M train step, 1 x {sys.argv[4]} tokens, fused Adam: best of the repeats' medians")
print(f"with the profiler's bookkeeping {prof:.4f} s, without {bare:.4f} s: overhead {100 * (prof / bare - 1):+.2f}%")
print("target (overhead under 2%):", "met" if prof <= 1.02 * bare else "NOT met")
PY
