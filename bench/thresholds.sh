#!/usr/bin/env bash
# tapdiff bench/thresholds.sh: the false-alarm sweep of the thresholds test
# (harness/tests/test_thresholds.c) at full length: every fixture x prompt
# (1, 8, 40 tokens) x threads (1, 2) on cpu (native) and llamacpp (act-q8)
# (and ../shared/models/stories260K.gguf, FIXTURES=stories260K; skipped when absent),
# each against the f64 oracle run under the arm's profile with ref32 under
# the same profile as control, STEPS decode steps (default 64).
#
#   bench/thresholds.sh [BUILD_DIR]     (default build)
#
# Prints the test's per-fixture lines (TIES: rounding ties where the oracle
# took the arm's side, harness/ties.h), the comparisons run, the time and
# the exit status (0: no false alarm anywhere). Environment: STEPS,
# FIXTURES (comma-separated subset; default every fixture).
#
# ARM=llamacpp:vulkan sweeps the Vulkan arm instead (a GPU arm where one is
# present; lavapipe counts): the same fixtures x prompts (1, 8, 40) x
# threads (1, 2: the arm's CPU-side threads) x STEPS, each cell the
# three-arm bisect of bench/vulkan_fixtures.sh (llamacpp vs
# llamacpp:vulkan, each against the f64 oracle under its own profile, ref32
# under it as control, rounding ties read from the arm's taps), FA=1 for
# flash attention; exit 0 only when every cell is conformant on both arms,
# 77 without a Vulkan device. lavapipe is CPU-heavy: minutes per cell.
#
# Each fixture runs in its own test process (TD_THRESH_FIXTURES=NAME) with
# the test's timeout (4 h): one Criterion process running
# every fixture for minutes each aborted after ~14 minutes ("Could not spawn
# test instance: Protocol error", SIGABRT), losing the fixtures after it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
exe="$build/harness/tests/test_thresholds"
[ -x "$exe" ] || { echo "thresholds: no $exe (build first: ninja -C $build)" >&2; exit 2; }
if [ "${ARM:-}" = llamacpp:vulkan ]; then
  stories=0 list=""
  for fx in ${FIXTURES//,/ }; do
    if [ "$fx" = stories260K ]; then stories=1; else list="$list${list:+,}$fx"; fi
  done
  [ -n "${FIXTURES:-}" ] && [ -z "$list" ] && list=none
  STEPS=${STEPS:-64} THREADS="1 2" STRICT=1 STORIES=$stories FIXTURES=$list exec bash bench/vulkan_fixtures.sh "$build"
fi
[ -z "${ARM:-}" ] || { echo "thresholds: ARM=$ARM: only llamacpp:vulkan (unset: cpu and llamacpp)" >&2; exit 2; }
export TD_THRESH_STEPS=${STEPS:-64} TD_THRESH_FULL=1
export TD_TAPDIFF="$PWD/$build/tapdiff" TD_SHARED="$PWD/../shared" TD_SOURCE_ROOT="$PWD"
if [ -n "${FIXTURES:-}" ]; then
  fixtures=${FIXTURES//,/ }
else
  fixtures=$("$build/tapdiff" fixture --list | awk '{print $1}')
  fixtures="$fixtures stories260K" # the real model (../shared/models), skipped when absent
fi
start=$(date +%s)
rc=0 failed=""
for fx in $fixtures; do
  set +e
  TD_THRESH_FIXTURES=$fx "$exe" --filter 'thresholds/no_false_alarm*' -j1 2>&1 |
    grep -v -e '^\[----\] *$' -e '^\[SKIP\]' -e '^\[====\] Synthesis'
  one=${PIPESTATUS[0]}
  set -e
  if [ "$one" != 0 ]; then rc=1 failed="$failed $fx(exit $one)"; fi
done
echo "thresholds: $TD_THRESH_STEPS decode steps, $(( $(date +%s) - start )) s, exit $rc${failed:+, failed:$failed}"
exit "$rc"
