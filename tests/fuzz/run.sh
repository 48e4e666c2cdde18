#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, AddressSanitizer + UBSan, system allocator) into
# BUILD_DIR and runs each for SECONDS on its seed corpus and dictionary. Fails when any
# fuzzer finds a crash, a leak, undefined behaviour, a timeout or a broken invariant; the
# input is left in BUILD_DIR/fuzz-artifacts/TIME/ with the command that replays it. Put such an
# input in tests/fuzz/corpus/NAME/ (and a case in tests/model/) once it is fixed.
#
#   tests/fuzz/run.sh [BUILD_DIR [SECONDS]]      defaults: build-fuzz, 20 seconds per fuzzer
#   FUZZERS="config bytes" tests/fuzz/run.sh     only those (default: every fuzz_*.c here)
#   JOBS=2 CC=clang-14 tests/fuzz/run.sh         build parallelism, compiler (default clang, else clang-14)
#
# New inputs that reach new code go to BUILD_DIR/fuzz-corpus/NAME/, never into the source tree.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-build-fuzz}"
seconds="${2:-20}"
jobs="${JOBS:-2}"
cc="${CC:-}"
if [ -z "$cc" ]; then
  cc=clang
  command -v clang >/dev/null || cc=clang-14
fi
case "$seconds" in '' | *[!0-9]*) echo "run.sh: SECONDS must be a whole number, not '$seconds'" >&2; exit 2 ;; esac
command -v "$cc" >/dev/null || { echo "run.sh: $cc not found (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }

if [ -z "${FUZZERS:-}" ]; then
  FUZZERS=""
  for src in "$here"/fuzz_*.c; do
    src="${src##*/fuzz_}"
    FUZZERS="$FUZZERS ${src%.c}"
  done
fi
targets=""
for name in $FUZZERS; do targets="$targets fuzz_$name"; done

configure() {
  cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMEMBILL_SANITIZE=ON -DMEMBILL_FUZZ=ON -DMEMBILL_WERROR=ON >/dev/null
}
configure
# a build folder made with another compiler: CMake empties its cache and drops the options
# of that first run, so a second one sets them
grep -q '^MEMBILL_FUZZ:BOOL=ON' "$build/CMakeCache.txt" || configure
grep -q '^MEMBILL_FUZZ:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "run.sh: $build is not configured for fuzzing; use a fresh folder" >&2; exit 1; }
# shellcheck disable=SC2086
cmake --build "$build" -j"$jobs" --target $targets >/dev/null

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
artifacts="$build/fuzz-artifacts/$(date +%Y%m%d-%H%M%S)"
for name in $FUZZERS; do
  bin="$(find "$build" -type f -name "fuzz_$name" -perm -u+x | head -n 1)"
  [ -n "$bin" ] || { echo "run.sh: fuzz_$name was not built" >&2; exit 1; }
  work="$build/fuzz-corpus/$name"
  mkdir -p "$work" "$artifacts"
  dict=()
  [ -f "$here/$name.dict" ] && dict=("-dict=$here/$name.dict")
  log="$build/fuzz-$name.log"
  echo "fuzz_$name: ${seconds} s (log: $log)"
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/$name-" "${dict[@]}" "$work" "$here/corpus/$name" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tail -n 2 | sed 's/^/  /'
  else
    failed+=("$name")
    echo "  FAILED: $(grep -m1 -E 'ERROR: |invariant failed|runtime error|deadly signal|timeout' "$log" || echo 'see the log')"
    for a in "$artifacts/$name-"*; do
      [ -f "$a" ] && echo "  input: $a   replay: $bin $a"
    done
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "run.sh: fuzzers that failed: ${failed[*]}" >&2
  exit 1
fi
echo "run.sh: every fuzzer ran ${seconds} s without a finding"
