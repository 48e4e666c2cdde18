#!/usr/bin/env bash
# Real runs in each dtype, SmolLM2-135M (random init), all measured in the same run (the machine
# is shared: only ratios taken together mean anything):
# - the training step (batch 1, Adam fused, steady state: the median of steps 2 on) in float32
#   and in bf16-mixed, at each of LENGTHS tokens, the two alternating REPEAT times, the best run
#   of each (another process on the machine only ever slows a run down);
# - the decode step (25-token prompt, median step of 40) in float32, bfloat16, int8 and int4
#   weights, each against its weight-read floor: every weight read once, its bytes in its dtype,
#   at the read bandwidth bench_bandwidth measures: the best of the probes over as many bytes or
#   more (one before and one after over the float32 weights' size, one over each dtype's own
#   weight size, which may fit the last-level cache as the step's weights may);
# - 40 new tokens with the cache in each, beside PyTorch 1.13's float32 and quantize_dynamic int8.
#
#   tests/bench/bench_dtype.sh [BUILD_DIR] [THREADS] [LENGTHS] [STEPS] [REPEAT]
#
# Defaults: build, 2, "128 512", 3, 3. Needs /usr/bin/python3 with torch (Debian python3-torch).
# Targets: the bf16-mixed step at least 1.5x faster than float32's; int8 and int4 decode steps
# faster than float32's and within 1.5x of their floors.
set -euo pipefail
build=${1:-build}
threads=${2:-2}
lengths=${3:-128 512}
steps=${4:-3}
repeat=${5:-3}
membill="$build/examples/membill/membill"
infer="$build/tests/bench/bench_infer"
bw="$build/tests/bench/bench_bandwidth"
here=$(cd "$(dirname "$0")" && pwd)
torch_py="$here/../reference/bench_torch.py"
. "$here/same_blas.sh"
for f in "$membill" "$infer" "$bw"; do
  [ -x "$f" ] || { echo "bench_dtype.sh: $f is missing: build the project first" >&2; exit 1; }
done
if [ "$steps" -lt 2 ] || ! [ "$repeat" -ge 1 ] 2>/dev/null; then
  echo "bench_dtype.sh: STEPS must be >= 2 and REPEAT >= 1" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bw" "$threads" 5 >"$tmp/bw1.json"
for n in $lengths; do
  for r in $(seq "$repeat"); do
    for d in fp32 bf16-mixed; do
      "$membill" train --steps "$steps" --threads "$threads" --seq-len "$n" --adam-impl fused --dtype "$d" \
        --quiet --json "$tmp/train-$d-$n-$r.json"
    done
  done
done
"$infer" --threads "$threads" --repeat "$repeat" --json "$tmp/infer-fp32.json" >/dev/null
"$infer" --threads "$threads" --repeat "$repeat" --dtype bf16 --json "$tmp/infer-bf16.json" >/dev/null
"$infer" --threads "$threads" --repeat "$repeat" --weight-dtype int8 --json "$tmp/infer-int8.json" >/dev/null
"$infer" --threads "$threads" --repeat "$repeat" --weight-dtype int4 --json "$tmp/infer-int4.json" >/dev/null
for v in fp32 int8; do
  flag=""
  [ "$v" = int8 ] && flag=--int8
  for r in $(seq "$repeat"); do
    same_blas "$tmp/bw1.json" env OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$torch_py" --mode generate \
      --threads "$threads" --batch-prompts 1 $flag \
      >"$tmp/torch-$v-$r.json"
  done
done
"$bw" "$threads" 5 >"$tmp/bw2.json"
# The read rate over each weight set's own size too (the smaller ones may sit in the last-level
# cache from one decode step to the next): the floor takes the best rate any probe saw.
for v in fp32 bf16 int8 int4; do
  bytes=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["weight_bytes"])' "$tmp/infer-$v.json")
  "$bw" "$threads" 8 "$bytes" >"$tmp/bw-$v.json"
done

/usr/bin/python3 - "$tmp" "$repeat" $lengths <<'PY'
import json, statistics, sys
d, repeat, lengths = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
load = lambda n: json.load(open(f"{d}/{n}"))
bw = [load("bw1.json"), load("bw2.json")]
# Each probe's (bytes, GB/s). A weight set reads at least as fast as any probe over as many bytes
# or more, so its floor takes the best of those.
probes = [(b["bytes"], b["read_gbs"]) for b in bw + [load(f"bw-{v}.json") for v in ("fp32", "bf16", "int8", "int4")]]
read_for = lambda n: max(g for b, g in probes if b >= n - 256)
read = max(b["read_gbs"] for b in bw)
print(f"machine: read {read:.1f} GB/s over the float32 weights' size ({bw[0]['threads']} threads, best of two "
      f"probes; over each dtype's weight size: " + ", ".join(f"{g:.1f}" for _, g in probes[2:]) + "), "
      f"OpenBLAS kernels {bw[0].get('blas_core', '?')} (chosen by {bw[0].get('blas_core_by', 'OpenBLAS')}), float32 products on {bw[0].get('products', 'OpenBLAS')}")
print(f"training step, steady state (median of steps 2 on, best of {repeat} alternating runs):")
print(f"{'tokens':>6} {'float32 s':>10} {'bf16-mixed s':>13} {'speed-up':>9}   (target >= 1.5)")
step = lambda v, n, r: statistics.median(x["step_s"] for x in load(f"train-{v}-{n}-{r}.json")["timing"]["steps"][1:])
for n in lengths:
    s = {v: min(step(v, n, r + 1) for r in range(repeat)) for v in ("fp32", "bf16-mixed")}
    print(f"{n:>6} {s['fp32']:>10.3f} {s['bf16-mixed']:>13.3f} {s['fp32'] / s['bf16-mixed']:>9.2f}")
print("decode step (25-token prompt, median of 40 steps, best of runs) and 40 tokens with the cache:")
print(f"{'weights':>8} {'bytes':>12} {'step s':>8} {'floor s':>8} {'/ floor':>8} {'/ fp32':>7} {'40 tokens s':>12} "
      f"{'in products':>12}")
f32 = load("infer-fp32.json")
for v in ("fp32", "bf16", "int8", "int4"):
    m = load(f"infer-{v}.json")
    floor = m["weight_bytes"] / (read_for(m["weight_bytes"]) * 1e9)
    print(f"{v:>8} {m['weight_bytes']:>12,} {m['decode_step_s']:>8.4f} {floor:>8.4f} "
          f"{m['decode_step_s'] / floor:>8.2f} {m['decode_step_s'] / f32['decode_step_s']:>7.2f} {m['cached_s']:>12.3f} "
          f"{m['cached_products_s'] / m['cached_s']:>11.0%}")
    if m["decode_step_s"] < floor:
        print(f"  {v}: the step beat its floor: the read probes were disturbed; run the script again")
for v in ("fp32", "int8"):
    runs = [load(f"torch-{v}-{r + 1}.json")["timing"]["cached"] for r in range(repeat)]
    step = min(r["decode_step_s"] for r in runs)
    total = min(r["generate_s"] for r in runs)
    print(f"pytorch {v:>5}: decode step {step:.4f} s, 40 tokens {total:.3f} s")
PY
