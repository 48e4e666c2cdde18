#!/usr/bin/env bash
# Greedy generation on SmolLM2-135M (random init, float32): membill against PyTorch and against
# the memory-bandwidth floor of a decode step, all measured in the same run (the machine is
# shared: only figures taken together mean anything).
#
#   tests/bench/bench_infer.sh [BUILD_DIR] [THREADS] [REPEAT]
#
# BUILD_DIR defaults to ./build; it must hold tests/bench/bench_infer and
# tests/bench/bench_bandwidth. Needs /usr/bin/python3 with torch (Debian python3-torch), run
# with OMP_WAIT_POLICY=PASSIVE. Each side runs REPEAT times (default 3) and each figure is the
# best of its runs, the least disturbed one, for membill and PyTorch alike.
#
# Runs: the prefill of a 25-token prompt and the median decode step; 40 new tokens with the KV
# cache and without it (every step recomputes the whole sequence); 8 prompts x 20 new tokens one
# after another and as one batch of 8. The floor of a decode step: it reads every weight once,
# 538,060,032 bytes, at the read bandwidth bench_bandwidth measures (the better of a probe before
# and one after the runs). Targets: a decode step within 1.3x of that floor; 40 tokens
# with the cache in at most 0.5x PyTorch's time; the batch's speed-up over one-by-one at least
# PyTorch's.
set -euo pipefail
build=${1:-build}
threads=${2:-2}
repeat=${3:-3}
infer="$build/tests/bench/bench_infer"
bw="$build/tests/bench/bench_bandwidth"
here=$(cd "$(dirname "$0")" && pwd)
torch_py="$here/../reference/bench_torch.py"
. "$here/same_blas.sh"
for f in "$infer" "$bw"; do
  [ -x "$f" ] || { echo "bench_infer.sh: $f is missing: build the project first" >&2; exit 1; }
done
if ! [ "$repeat" -ge 1 ] 2>/dev/null || ! [ "$threads" -ge 1 ] 2>/dev/null; then
  echo "bench_infer.sh: THREADS and REPEAT must be numbers >= 1" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bw" "$threads" 5 >"$tmp/bw.json"
"$infer" --batch-claim --threads "$threads" --repeat "$repeat" --json "$tmp/membill.json" \
  >"$tmp/membill.txt"
for r in $(seq "$repeat"); do
  same_blas "$tmp/bw.json" env OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$torch_py" --mode generate --threads "$threads" \
    >"$tmp/torch$r.json"
done
"$bw" "$threads" 5 >"$tmp/bw2.json"

/usr/bin/python3 - "$tmp" "$repeat" <<'PYEOF'
import json, sys
d, repeat = sys.argv[1], int(sys.argv[2])
load = lambda n: json.load(open(f"{d}/{n}"))
m, bw1, bw2 = load("membill.json"), load("bw.json"), load("bw2.json")
runs = [load(f"torch{r + 1}.json")["timing"] for r in range(repeat)]
best = lambda f: min(f(t) for t in runs)
t = {"prefill_s": best(lambda t: t["cached"]["prefill_s"]),
     "decode_step_s": best(lambda t: t["cached"]["decode_step_s"]),
     "cached_s": best(lambda t: t["cached"]["generate_s"]),
     "uncached_s": best(lambda t: t["uncached"]["generate_s"]),
     "sequential_s": best(lambda t: t["sequential_s"]),
     "batched_s": best(lambda t: t["batched_s"])}
mb = m["batch"]
ours = {"prefill_s": m["prefill_s"], "decode_step_s": m["decode_step_s"],
        "cached_s": m["cached_s"], "uncached_s": m["uncached_s"],
        "sequential_s": mb["sequential_s"], "batched_s": mb["batched_s"]}
read = max(bw1["read_gbs"], bw2["read_gbs"])
weight_bytes = bw1["bytes"]  # 538,060,032: SmolLM2-135M's weights, read once a decode step
floor = weight_bytes / (read * 1e9)
T, N = m["tokens"], m["new_tokens"]
B, BN = mb["prompts"], mb["new_tokens"]
rows = [("prefill_s", f"prefill, {T} tokens"), ("decode_step_s", "decode step (median)"),
        ("cached_s", f"{N} tokens with the cache"), ("uncached_s", f"{N} tokens without the cache"),
        ("sequential_s", f"{B} x {BN} tokens one by one"),
        ("batched_s", f"{B} x {BN} tokens, batch of {B}")]
print(f"SmolLM2-135M greedy generation, random init, float32, {m['threads']} threads; "
      f"best of {repeat} runs each; OpenBLAS kernels {bw1.get('blas_core', '?')}"
      f" (chosen by {bw1.get('blas_core_by', 'OpenBLAS')}), float32 products on {bw1.get('products', 'OpenBLAS')}")
print(f"{'run':<36} {'membill':>10} {'pytorch':>10} {'ratio':>7}")
for k, name in rows:
    print(f"{name:<36} {ours[k]:>9.4f}s {t[k]:>9.4f}s {ours[k] / t[k]:>7.3f}")
speed_m = ours["sequential_s"] / ours["batched_s"]
speed_t = t["sequential_s"] / t["batched_s"]
cache_m = ours["uncached_s"] / ours["cached_s"]
cache_t = t["uncached_s"] / t["cached_s"]
print(f"{'batch speed-up (one by one / batch)':<36} {speed_m:>9.2f}x {speed_t:>9.2f}x")
print(f"{'cache speed-up (without / with)':<36} {cache_m:>9.2f}x {cache_t:>9.2f}x")
print(f"membill's batch prefill {mb['batch_prefill_s']:.4f} s, its median decode step "
      f"{mb['batch_decode_step_s']:.4f} s; same tokens with and without the cache: "
      f"{'yes' if m['same_tokens'] else 'NO'}, batch rows as one by one: "
      f"{'yes' if mb['same_tokens'] else 'NO'}")
print(f"bandwidth ({bw1['threads']} threads, best of two probes): read {read:.1f} GB/s")
print(f"decode-step floor: {weight_bytes:,} bytes / read bandwidth = {floor:.4f} s; "
      f"decode step / floor: {ours['decode_step_s'] / floor:.2f}")
met = lambda ok: "met" if ok else "NOT met"
print(f"targets: decode step <= 1.3 x floor: {met(ours['decode_step_s'] <= 1.3 * floor)}; "
      f"{N} tokens with the cache <= 0.5 x pytorch: {met(ours['cached_s'] <= 0.5 * t['cached_s'])}; "
      f"batch speed-up >= pytorch's: {met(speed_m >= speed_t)}")
PYEOF
