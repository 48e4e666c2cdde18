#!/bin/sh
# A test that cannot run here: says why and exits 77, which ctest reports as skipped.
echo "skipped: $1"
exit 77
