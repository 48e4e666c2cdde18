#!/usr/bin/env bash
# One SmolLM2-135M training step (batch 1 x 25 tokens, Adam, float32): membill against PyTorch
# and against the memory-bandwidth floor, all measured in the same run (the machine is shared:
# only ratios taken together mean anything).
#
#   tests/bench/bench_train.sh [BUILD_DIR] [STEPS] [THREADS]
#
# BUILD_DIR defaults to ./build; it must hold examples/membill/membill and
# tests/bench/bench_bandwidth. Needs /usr/bin/python3 with torch (Debian python3-torch).
#
# The floor: a step moves at least 10 passes over the weights' 538,060,032 bytes (forward reads
# W; backward reads W and writes dW; Adam reads w, g, m, v and writes w, m, v). Those passes mix
# reads and writes (6 to 4), so the floor divides them by the copy bandwidth, which counts the
# bytes read plus the bytes written per second. That is the faster figure, hence the lower,
# stricter floor; the floor at the read-only bandwidth is printed beside it.
#
# At 25 tokens the matrix products are bound by arithmetic rather than memory on some machines,
# so the script also prints a compute floor: the linears' 6 x tokens x parameters flops (forward
# 2, backward 4) at the float32 multiply-add rate bench_bandwidth measures, and a combined floor:
# that compute for forward and backward (their 3 weight-sized passes can hide under it) plus the
# optimizer's 7 passes at the copy bandwidth.
set -euo pipefail
build=${1:-build}
steps=${2:-5}
threads=${3:-2}
membill="$build/examples/membill/membill"
bw="$build/tests/bench/bench_bandwidth"
here=$(cd "$(dirname "$0")" && pwd)
torch_py="$here/../reference/bench_torch.py"
for f in "$membill" "$bw"; do
  [ -x "$f" ] || { echo "bench_train.sh: $f is missing: build the project first" >&2; exit 1; }
done
if [ "$steps" -lt 2 ]; then
  echo "bench_train.sh: STEPS must be >= 2 (steady state is step 2 on)" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bw" "$threads" 5 >"$tmp/bw.json"
# The floors below count the fused Adam pass (7 streams), so membill runs that one.
"$membill" train --steps "$steps" --threads "$threads" --adam-impl fused --quiet --json "$tmp/membill.json"
OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$torch_py" --mode train --steps "$steps" \
  --threads "$threads" >"$tmp/torch.json"
"$bw" "$threads" 5 >"$tmp/bw2.json"

/usr/bin/python3 - "$tmp" <<'EOF'
import json, statistics, sys
d = sys.argv[1]
load = lambda n: json.load(open(f"{d}/{n}"))
m, t, bw1, bw2 = load("membill.json"), load("torch.json"), load("bw.json"), load("bw2.json")
# The faster of the two probes (before and after the runs): the less disturbed one.
copy = max(bw1["copy_gbs"], bw2["copy_gbs"])
read = max(bw1["read_gbs"], bw2["read_gbs"])
passes, weight_bytes = 10, m["categories"]["weight"]["peak_bytes"]
floor_copy = passes * weight_bytes / (copy * 1e9)
floor_read = passes * weight_bytes / (read * 1e9)
fma = max(bw1["fma_gflops"], bw2["fma_gflops"])
flops = 6 * m["run"]["batch"] * m["run"]["seq_len"] * m["model"]["parameters"]
floor_compute = flops / (fma * 1e9) if fma else float("nan")
pass_s = weight_bytes / (copy * 1e9)  # one weight-sized pass at the copy bandwidth
floor_combined = max(floor_compute, 3 * pass_s) + 7 * pass_s
phases = ("forward_s", "backward_s", "optimizer_s", "step_s")

def steady(steps, k):
    return statistics.median(s[k] for s in steps[1:])

ours = {k: steady(m["timing"]["steps"], k) for k in phases}
theirs = {k: steady(t["timing"]["steps"], k) for k in phases}
run = m["run"]
print(f"SmolLM2-135M train step, batch {run['batch']} x {run['seq_len']} tokens, Adam, "
      f"float32, {run['threads']} threads; medians of steps 2..{len(m['timing']['steps'])}")
print(f"{'phase':<10} {'membill s':>10} {'pytorch s':>10} {'ratio':>7}")
for k in phases:
    print(f"{k[:-2]:<10} {ours[k]:>10.3f} {theirs[k]:>10.3f} {ours[k] / theirs[k]:>7.3f}")
print(f"bandwidth ({bw1['threads']} threads, best of two probes): read {read:.1f} GB/s, "
      f"copy {copy:.1f} GB/s (read + write)")
print(f"floor: {passes} passes x {weight_bytes / 1e6:.1f} MB / copy bandwidth = {floor_copy:.3f} s "
      f"(at the read bandwidth: {floor_read:.3f} s)")
print(f"step / floor: {ours['step_s'] / floor_copy:.2f} (at the read bandwidth: "
      f"{ours['step_s'] / floor_read:.2f})")
print(f"compute: {fma:.1f} GFLOP/s float32 multiply-add; linears {flops / 1e9:.2f} GFLOP = "
      f"{floor_compute:.3f} s; combined floor {floor_combined:.3f} s, step / combined floor: "
      f"{ours['step_s'] / floor_combined:.2f}")
print(f"peak RSS: membill {m['process']['peak_rss_bytes'] / 1e9:.3f} GB, "
      f"pytorch {t['process']['peak_rss_bytes'] / 1e9:.3f} GB")
met = lambda ok: "met" if ok else "NOT met"
print(f"targets: step <= 0.35 x pytorch: {met(ours['step_s'] <= 0.35 * theirs['step_s'])}; "
      f"step <= 2 x floor: {met(ours['step_s'] <= 2 * floor_read)} at the read bandwidth, "
      f"{met(ours['step_s'] <= 2 * floor_copy)} at the copy bandwidth; "
      f"peak RSS <= 2.30 GB: {met(m['process']['peak_rss_bytes'] <= 2.30e9)}")
EOF
