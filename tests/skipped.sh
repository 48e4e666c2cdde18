#!/bin/sh
# After ctest: each test that skipped this run, with the reason it left and what installs the
# missing piece (ctest shows a skip as "***Skipped" alone, even under --output-on-failure).
#
#   tests/skipped.sh NOTES_DIR
for note in "$1"/*; do
  [ -f "$note" ] || continue
  printf 'skipped %s: %s\n' "${note##*/}" "$(cat "$note")"
done
exit 0
