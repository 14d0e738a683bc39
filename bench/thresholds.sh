#!/usr/bin/env bash
# tapdiff bench/thresholds.sh: the false-alarm sweep of the thresholds test
# (harness/tests/test_thresholds.c) at full length: every fixture x prompt
# (1, 8, 40 tokens) x threads (1, 2) on cpu (native) and llamacpp (act-q8),
# each against the f64 oracle run under the arm's profile with ref32 under
# the same profile as control, STEPS decode steps (default 64).
#
#   bench/thresholds.sh [BUILD_DIR]     (default build)
#
# Prints the test's per-fixture lines, the comparisons run, the wall time
# and the exit status (0: no false alarm anywhere). Environment: STEPS,
# FIXTURES (comma-separated subset; default every fixture).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
exe="$build/harness/tests/test_thresholds"
[ -x "$exe" ] || { echo "thresholds: no $exe (build first: ninja -C $build)" >&2; exit 2; }
export TD_THRESH_STEPS=${STEPS:-64} TD_THRESH_FULL=1 TD_THRESH_FIXTURES=${FIXTURES:-}
export TD_TAPDIFF="$PWD/$build/tapdiff" TD_SHARED="$PWD/../shared" TD_SOURCE_ROOT="$PWD"
start=$(date +%s)
set +e
"$exe" --filter 'thresholds/no_false_alarm*' -j1 2>&1 | grep -v '^\[----\] *$'
rc=${PIPESTATUS[0]}
set -e
echo "thresholds: $TD_THRESH_STEPS decode steps, $(( $(date +%s) - start )) s, exit $rc"
exit "$rc"
