#!/usr/bin/env bash
# The SmolLM2-135M training step (batch 1, Adam, float32) at several lengths: membill against
# PyTorch 1.13 and against the step's floor, all measured in the same run (the machine is
# shared: only ratios taken together mean anything).
#
#   tests/bench/bench_train.sh [BUILD_DIR] [STEPS] [THREADS] [LENGTHS] [TORCH_LENGTHS]
#
# Defaults: build, 5, 2, "25 128 512 2048", "25 128 512" (PyTorch's eager step at 2,048 tokens
# takes minutes). BUILD_DIR must hold examples/membill/membill and tests/bench/bench_bandwidth.
# Needs /usr/bin/python3 with torch (Debian python3-torch), run with OMP_WAIT_POLICY=PASSIVE.
#
# The floor of a step is the larger of two:
# - bandwidth: at least 10 passes over the weights' bytes (forward reads W; backward reads W
#   and writes dW; Adam reads w, g, m, v and writes w, m, v), at the faster of two rates of
#   bytes read plus bytes written a second: a copy's, and the optimizer's pattern (four streams
#   read, three written back in place: bench_bandwidth's update_gbs). Where memory reads and
#   writes at once (AMD's chiplets: one link each way) the second is the higher, and a floor
#   at the copy rate alone is one the optimizer beats;
# - compute: 6 x parameters x tokens (the linears: forward 2, backward 4) plus attention's
#   12 x layers x heads x head_dim x tokens^2 (QKᵀ and PV, forward 4, backward 8), at the peak
#   multiply-add rate bench_bandwidth measures with a kernel that reaches it.
# The phases run one after another (Adam after the whole backward, as in PyTorch), so each has
# its own floor, the larger of its passes and its arithmetic: forward 1 pass and 2 x parameters
# x tokens + 4 x layers x heads x head_dim x tokens^2, backward 2 passes and twice that, the
# optimizer 7 passes. Where those add up to more than 1.5 x the step's floor, the bench says the
# target is out of reach at that length: no schedule of these phases in order meets it.
# membill runs the fused Adam (the floor's 7 streams); PyTorch its CPU default, the for-loop.
set -euo pipefail
build=${1:-build}
steps=${2:-5}
threads=${3:-2}
lengths=${4:-25 128 512 2048}
torch_lengths=${5:-25 128 512}
membill="$build/examples/membill/membill"
bw="$build/tests/bench/bench_bandwidth"
here=$(cd "$(dirname "$0")" && pwd)
torch_py="$here/../reference/bench_torch.py"
. "$here/same_blas.sh"
for f in "$membill" "$bw"; do
  [ -x "$f" ] || { echo "bench_train.sh: $f is missing: build the project first" >&2; exit 1; }
done
if [ "$steps" -lt 2 ]; then
  echo "bench_train.sh: STEPS must be >= 2 (steady state is step 2 on)" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bw" "$threads" 5 >"$tmp/bw1.json"
for n in $lengths; do
  "$membill" train --steps "$steps" --threads "$threads" --seq-len "$n" --adam-impl fused --quiet \
    --json "$tmp/membill-$n.json"
  case " $torch_lengths " in *" $n "*)
    same_blas "$tmp/bw1.json" env OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$torch_py" --mode train --steps "$steps" \
      --threads "$threads" --seq-len "$n" >"$tmp/torch-$n.json" ;;
  esac
done
"$bw" "$threads" 5 >"$tmp/bw2.json"

/usr/bin/python3 - "$tmp" $lengths <<'PY'
import json, os, statistics, sys
d, lengths = sys.argv[1], [int(x) for x in sys.argv[2:]]
load = lambda n: json.load(open(f"{d}/{n}"))
bw = [load("bw1.json"), load("bw2.json")]
# The best of the two probes (before and after the runs): the less disturbed one.
copy, read, fma = (max(b[k] for b in bw) for k in ("copy_gbs", "read_gbs", "fma_gflops"))
update = max(b.get("update_gbs", 0) for b in bw)
moved = max(copy, update)
phases = ("forward_s", "backward_s", "optimizer_s", "step_s")
steady = lambda steps, k: statistics.median(s[k] for s in steps[1:])
print(f"machine: copy {copy:.1f} GB/s, update in place {update:.1f} GB/s, read {read:.1f} GB/s, peak float32 multiply-add {fma:.1f} GFLOP/s "
      f"({bw[0]['threads']} threads, best of two probes), OpenBLAS kernels {bw[0].get('blas_core', '?')}"
      f" (chosen by {bw[0].get('blas_core_by', 'OpenBLAS')}), float32 products on {bw[0].get('products', 'OpenBLAS')}")
print(f"{'tokens':>6} {'membill s':>10} {'pytorch s':>10} {'/ pytorch':>10} {'floor s':>8} {'bound by':>9} "
      f"{'/ floor':>8} {'phases s':>9}   membill forward / backward / optimizer s")
met = True
for n in lengths:
    m = load(f"membill-{n}.json")
    ours = {k: steady(m["timing"]["steps"], k) for k in phases}
    cfg, run = m["model"], m["run"]
    tokens = run["batch"] * n
    weight_bytes = m["categories"]["weight"]["peak_bytes"]
    f_bw = 10 * weight_bytes / (moved * 1e9)
    att = 12 * cfg["layers"] * cfg["heads"] * cfg["head_dim"] * run["batch"] * n * n
    f_cpu = (6 * cfg["parameters"] * tokens + att) / (fma * 1e9)
    floor, bound = (f_bw, "memory") if f_bw >= f_cpu else (f_cpu, "compute")
    pass_s, fwd_flops = weight_bytes / (moved * 1e9), 2 * cfg["parameters"] * tokens + att / 3
    phases_floor = (max(pass_s, fwd_flops / (fma * 1e9)) + max(2 * pass_s, 2 * fwd_flops / (fma * 1e9))
                    + 7 * pass_s)
    theirs = None
    if os.path.exists(f"{d}/torch-{n}.json"):
        theirs = steady(load(f"torch-{n}.json")["timing"]["steps"], "step_s")
    vs = f"{ours['step_s'] / theirs:>10.3f}" if theirs else f"{'-':>10}"
    ts = f"{theirs:>10.3f}" if theirs else f"{'-':>10}"
    print(f"{n:>6} {ours['step_s']:>10.3f} {ts} {vs} {floor:>8.3f} {bound:>9} {ours['step_s'] / floor:>8.2f} {phases_floor:>9.3f}   "
          f"{ours['forward_s']:.3f} / {ours['backward_s']:.3f} / {ours['optimizer_s']:.3f}")
    met &= ours["step_s"] <= 1.5 * floor and (theirs is None or ours["step_s"] <= 0.35 * theirs)
    if phases_floor > 1.5 * floor:
        print(f"  1.5 x the floor is out of reach at {n} tokens: the phases, one after another, "
              f"have floors that add up to {phases_floor / floor:.2f} x it")
    if ours["step_s"] < floor:
        print(f"  the step beats its floor at {n} tokens: the floor is wrong")
    elif ours["step_s"] < phases_floor:  # never below the floor, which it bounds
        print(f"  the step beats its phases' floors at {n} tokens: the floor is wrong")
    if ours["optimizer_s"] < 7 * pass_s:
        print(f"  the optimizer beats its 7 passes at {moved:.1f} GB/s at {n} tokens: the floor is wrong")
print("targets (every length: step <= 0.35 x pytorch and <= 1.5 x floor):", "met" if met else "NOT met")
PY
