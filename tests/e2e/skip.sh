#!/bin/sh
# A test that cannot run here: says why (on its output and in $MEMBILL_SKIP_NOTE, which ctest's
# summary prints) and exits 77, which ctest reports as skipped.
echo "skipped: $1"
[ -n "${MEMBILL_SKIP_NOTE:-}" ] && mkdir -p "$(dirname "$MEMBILL_SKIP_NOTE")" && echo "$1" >"$MEMBILL_SKIP_NOTE"
exit 77
