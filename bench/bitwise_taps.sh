#!/usr/bin/env bash
# tapdiff bench/bitwise_taps.sh: a refactor of a backend must leave its taps
# bit for bit as they were. Runs two tapdiff binaries (BEFORE, AFTER) with the
# same arguments over fixtures x prompt lengths x threads x profiles, each a
# prefill plus STEPS decode steps with full taps, and compares every pair of
# tap files twice: h5diff over /steps (every dataset and its attributes, exact
# equality; the root's provenance differs on purpose) and `tapdiff compare`
# (its verdict). Exit 1 on the first pair that differs, 0 when all are equal.
#
#   bench/bitwise_taps.sh BEFORE AFTER
#
# Environment: BACKEND (cpu), FIXTURES (qwen3next-f32 qwen3next-q8_0
# qwen4exp-f32 qwen4exp-q8_0 qwen4exp-ties), PROMPTS (1 8 40), STEPS (8),
# THREADS (1 2), PROFILES (native act-q8), OUT (out/bitwise). Prompt of n
# tokens: (37 t + 11) mod 290. Long: minutes per binary on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: bench/bitwise_taps.sh BEFORE AFTER" >&2; exit 2; }
before=$1 after=$2
for b in "$before" "$after"; do [ -x "$b" ] || { echo "bitwise_taps: no executable $b" >&2; exit 2; }; done
command -v h5diff >/dev/null || { echo "bitwise_taps: h5diff not found (Debian hdf5-tools)" >&2; exit 77; }
backend=${BACKEND:-cpu}
fixtures=${FIXTURES:-qwen3next-f32 qwen3next-q8_0 qwen4exp-f32 qwen4exp-q8_0 qwen4exp-ties}
out=${OUT:-out/bitwise}
mkdir -p "$out/models"
# shellcheck disable=SC2086
"$after" fixture --out "$out/models" --only "$(echo $fixtures | tr ' ' ,)" >/dev/null
n_pairs=0
for fx in $fixtures; do
  for n in ${PROMPTS:-1 8 40}; do
    toks=$(python3 -c "import sys; print(','.join(str((37 * t + 11) % 290) for t in range(int(sys.argv[1]))))" "$n")
    for th in ${THREADS:-1 2}; do
      for prof in ${PROFILES:-native act-q8}; do
        tag="$fx-p$n-t$th-$prof"
        for side in before after; do
          bin=$before; [ $side = after ] && bin=$after
          "$bin" run --model "$out/models/$fx.gguf" --backend "$backend" --tokens "$toks" --steps "${STEPS:-8}" \
            --threads "$th" --profile "$prof" --taps full --out "$out/$tag-$side.h5" --quiet >/dev/null
        done
        if ! h5diff -q "$out/$tag-before.h5" "$out/$tag-after.h5" /steps /steps; then
          echo "bitwise_taps: $tag: the tap files differ (h5diff $out/$tag-before.h5 $out/$tag-after.h5 /steps /steps)"
          exit 1
        fi
        if ! "$after" compare "$out/$tag-before.h5" "$out/$tag-after.h5" >"$out/$tag-compare.txt" 2>&1; then
          echo "bitwise_taps: $tag: tapdiff compare is not conformant ($out/$tag-compare.txt)"
          exit 1
        fi
        n_pairs=$((n_pairs + 1))
      done
    done
  done
done
echo "bitwise_taps: $n_pairs pairs of tap files ($backend) bitwise identical and conformant"
