#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs the unit and
# conformance suites, then the same tests under ASan + UBSan.
# Exit status is the verdict. Heavy suites (benchmarks) are not run here.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/setup.sh

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
status=0
summary=()

run_suite() { # dir label
  local dir=$1 label=$2 log
  log=$(mktemp)
  if meson test -C "$dir" --no-rebuild --print-errorlogs >"$log" 2>&1; then :; else status=1; fi
  cat "$log"
  local ok fail skip
  ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  fail=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  skip=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  summary+=("$label ${ok:-0} passed, ${fail:-0} failed, ${skip:-0} skipped")
  rm -f "$log"
}

bash ci/build.sh build
run_suite build "tests:"

# Sanitizers: a separate build dir; b_lundef=false is required with -fsanitize on meson.
bash ci/build.sh build-san -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
run_suite build-san "sanitized:"

# libFuzzer: a short run of each target (fuzz/run.sh; 25 s each). 77 = no clang.
fz=0
bash fuzz/run.sh 25 | tee /tmp/td_fuzz_summary.$$ || fz=$?
if [ $fz -eq 77 ]; then summary+=("fuzz: skipped (no clang/libFuzzer)")
elif [ $fz -ne 0 ]; then status=1; summary+=("fuzz: FINDINGS (build-fuzz/findings/)")
else summary+=("fuzz: $(grep -c ', exit 0' /tmp/td_fuzz_summary.$$) targets, no finding"); fi
rm -f /tmp/td_fuzz_summary.$$

echo
for s in "${summary[@]}"; do echo "$s"; done
exit $status
