#!/usr/bin/env bash
# The whole SmolLM2-135M training step with eager and with flash attention, one after the other in
# one run: the steady-state step (median of steps 2..N), its attention-free phases, the
# activation peak and the peak RSS of each, and their ratio. Prints figures; judges nothing.
#   tests/bench/bench_attention_step.sh [BUILD_DIR] [SEQ_LEN] [STEPS] [FRAMEWORK]
set -euo pipefail
build=${1:-build} seq=${2:-2048} steps=${3:-3} fw=${4:-lean}
bin="$build/examples/membill/membill"
declare -A step act rss
for att in eager flash; do
    out=$(mktemp)
    /usr/bin/time -f "%M" -o "$out.rss" "$bin" train --framework "$fw" --attention "$att" --seq-len "$seq" \
        --steps "$steps" --adam-impl fused --json "$out" --quiet
    read -r s a < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['timing']['step_s'], d['categories']['activation']['peak_bytes'])" "$out")
    step[$att]=$s act[$att]=$a rss[$att]=$(cat "$out.rss")
    rm -f "$out" "$out.rss"
    printf '%-6s step %.3f s (median of steps 2..%d), activation peak %s bytes, peak RSS %s kB\n' \
        "$att" "$s" "$steps" "$a" "${rss[$att]}"
done
python3 -c "import sys; e,f=map(float,sys.argv[1:]); print('flash step / eager step: %.2f (%s tokens, --framework %s)' % (f/e, '$seq', '$fw'))" \
    "${step[eager]}" "${step[flash]}"
