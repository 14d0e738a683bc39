#!/usr/bin/env bash
# tapdiff bench/kernel_rate.sh: weight bytes per CPU second of the cpu
# backend's native dot kernels (bench/kernel_rate.c), from L2 and from
# memory, at every kernel level this CPU runs; ROUNDS (default 3) runs each.
#
#   bench/kernel_rate.sh [BUILD_DIR]    (default build; links its static libraries)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/backends/cpu/libtd_cpu.a" ] || { echo "kernel_rate: build $build first" >&2; exit 2; }
exe=$(mktemp)
trap 'rm -f "$exe"' EXIT
cc -std=c17 -O2 -D_GNU_SOURCE -I backends/cpu -I model -o "$exe" bench/kernel_rate.c \
  "$build/backends/cpu/libtd_cpu.a" "$build/model/libtd_model.a" -lcrypto -lm -lpthread
for isa in 1 2; do
  for type in ${TYPES:-1 8 12}; do # F16 Q8_0 Q4_K
    for ((r = 1; r <= ${ROUNDS:-3}; r++)); do "$exe" "$isa" "$type" || [ $? = 77 ]; done
  done
done
