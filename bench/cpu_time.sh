#!/usr/bin/env bash
# tapdiff bench/cpu_time.sh: tokens/s per CPU second, one thread (THREADS=N:
# N threads, CPU time of all of them, spinning included), for a machine too
# busy for wall-clock numbers (side_by_side.sh). Each cell is
# 64 / (CPU time of one 64-token prefill) or 32 / (CPU time of 32 decode
# steps), the CPU time (user + sys) of `tapdiff bench --repeat 7` minus
# that of `--repeat 1` (so loading the model and the warm-up cancel), over
# 6; best of ROUNDS (default 2). Waiting for memory counts, waiting for a
# core does not: decode numbers are not comparable with the bandwidth bound.
#
#   bench/cpu_time.sh [BUILD_DIR]     (default build)
#
# Arms: cpu native, cpu act-q8, llama.cpp as users get it
# (TD_LLAMACPP_CPU_VARIANT=auto TD_LLAMACPP_USER_DEFAULTS=1) and llama.cpp
# aligned; every arm with --logits-last. BEFORE=/path/to/an/older/tapdiff
# adds its cpu arms (without --logits-last, which it may lack). Models as
# side_by_side.sh (out/bench/bench-T.gguf, made when missing); TYPES
# (default "q4_k q8_0 f16").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
td="$build/tapdiff"
[ -x "$td" ] || { echo "cpu_time: no $td" >&2; exit 2; }
mkdir -p out/bench
threads=${THREADS:-1}
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cput() { /usr/bin/time -f "%U %S" "$@" 2>&1 >"$json" | tail -1 | awk '{print $1 + $2}'; }
per() { # prefill|decode tapdiff bench-args...
  local mode=$1 a t1 t7
  shift
  a=(--threads "$threads" --bw-mib 1 --json)
  if [ "$mode" = prefill ]; then a+=(--prompt-len 64 --gen 0); else a+=(--prompt-len 1 --gen 32); fi
  t1=$(cput "$@" "${a[@]}" --repeat 1) t7=$(cput "$@" "${a[@]}" --repeat 7)
  python3 -c "import sys, json; d = (float(sys.argv[2]) - float(sys.argv[1])) / 6; n = 64 if sys.argv[3] == 'prefill' else 32
w = json.load(open(sys.argv[4]))['prefill_tok_s' if sys.argv[3] == 'prefill' else 'decode_tok_s']
print(('%.1f' % (n / d) if d > 0 else 'nan') + ' t=%s wall=%.1f' % (sys.argv[5], w))" "$t1" "$t7" "$mode" "$json" "$threads"
}
for t in ${TYPES:-q4_k q8_0 f16}; do
  m="out/bench/bench-$t.gguf"
  [ -f "$m" ] || "$td" bench --make-model "$m" --type "$t" >/dev/null
  for mode in prefill decode; do
    for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
      if [ -n "${BEFORE:-}" ]; then
        echo "$t $mode before-native $(per "$mode" "$BEFORE" bench --model "$m" --backend cpu)"
        echo "$t $mode before-act-q8 $(per "$mode" "$BEFORE" bench --model "$m" --backend cpu --profile act-q8)"
      fi
      echo "$t $mode cpu-native $(per "$mode" "$td" bench --model "$m" --backend cpu --logits-last)"
      echo "$t $mode cpu-act-q8 $(per "$mode" "$td" bench --model "$m" --backend cpu --profile act-q8 --logits-last)"
      echo "$t $mode llama.cpp-user $(TD_LLAMACPP_CPU_VARIANT=auto TD_LLAMACPP_USER_DEFAULTS=1 per "$mode" "$td" bench \
        --model "$m" --backend llamacpp --logits-last)"
      echo "$t $mode llama.cpp-aligned $(per "$mode" "$td" bench --model "$m" --backend llamacpp --logits-last)"
    done
  done
done
