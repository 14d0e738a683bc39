#!/usr/bin/env bash
# tapdiff bench/side_by_side.sh: our cpu backend and llama.cpp on the same
# GGUF files and the same thread counts, and the ratios.
#
#   bench/side_by_side.sh [BUILD_DIR]     (default build)
#
# Writes the benchmark models (llama arch, ~200M parameters, Q4_K, Q8_0,
# F16) into out/bench/ (ignored by git) when they are missing, then runs
# `tapdiff bench` for every (model, threads in 1 2, arm) and prints one table:
# prefill and decode tokens/s of each arm, ours / llama.cpp, and the decode
# memory-bandwidth bound. Arms: cpu (profile native, f32 activations),
# cpu --profile act-q8 (8-bit activations for quantized weights, as
# llama.cpp), and llama.cpp through tapdiff's llamacpp backend (its settings:
# flash attention off, f32 KV cache, no weight repacking, logits for every
# position, like ours). Each number is the best of REPEAT runs after a
# warm-up: on a shared machine, rerun when others are busy.
# The whole grid is run ROUNDS times (default 2) and each cell keeps its
# best value. Environment: PROMPT (default 64), GEN (default 32), REPEAT
# (default 3), ROUNDS (default 2), THREADS (default "1 2"), TYPES (default
# "q4_k q8_0 f16").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
td="$build/tapdiff"
[ -x "$td" ] || { echo "side_by_side: no $td (build first: meson setup $build && ninja -C $build)" >&2; exit 2; }
prompt=${PROMPT:-64} gen=${GEN:-32} repeat=${REPEAT:-3} rounds=${ROUNDS:-2}
threads=${THREADS:-"1 2"} types=${TYPES:-"q4_k q8_0 f16"}
mkdir -p out/bench

# 77: tapdiff knows the backend but this build lacks it (checked before the model is read)
have_llamacpp=1 rc=0
"$td" bench --model /dev/null --backend llamacpp >/dev/null 2>&1 || rc=$?
[ "$rc" = 77 ] && have_llamacpp=0

for t in $types; do
  f="out/bench/bench-$t.gguf"
  [ -f "$f" ] || "$td" bench --make-model "$f" --type "$t" >/dev/null
done

# one bench run -> "prefill decode bound" (tok/s)
run() { # model backend threads [profile]
  local extra=()
  [ -n "${4:-}" ] && extra=(--profile "$4")
  "$td" bench --model "$1" --backend "$2" --threads "$3" --prompt-len "$prompt" --gen "$gen" \
    --repeat "$repeat" --json "${extra[@]}" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f %.2f %.2f" % (d["prefill_tok_s"], d["decode_tok_s"], d["decode_bound_tok_s"]))'
}

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print('%.2f' % (a/b) if b > 0 else '-')" "$1" "$2"; }

# best (largest) value of each cell over ROUNDS passes of the whole grid:
# arms run one after another, so a busy spell only spoils one pass
declare -A best
keep() { # key value
  if [ -z "${best[$1]:-}" ] || python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$2" "${best[$1]}"; then
    best[$1]=$2
  fi
}
for ((r = 1; r <= rounds; r++)); do
  for t in $types; do
    f="out/bench/bench-$t.gguf"
    for th in $threads; do
      read -r p d b < <(run "$f" cpu "$th"); keep "$t/$th/np" "$p"; keep "$t/$th/nd" "$d"; keep "$t/$th/nb" "$b"
      if [ "$t" != f16 ]; then read -r p d _ < <(run "$f" cpu "$th" act-q8); keep "$t/$th/ap" "$p"; keep "$t/$th/ad" "$d"; fi
      if [ "$have_llamacpp" = 1 ]; then read -r p d _ < <(run "$f" llamacpp "$th"); keep "$t/$th/lp" "$p"; keep "$t/$th/ld" "$d"; fi
    done
  done
done

echo "prompt $prompt tokens, $gen decode steps, best of $repeat runs x $rounds rounds; tok/s (ratio = ours / llama.cpp)"
printf '%-6s %3s | %-21s | %-21s | %-21s | %-13s | %-13s | %s\n' type thr "cpu native pre/dec" "cpu act-q8 pre/dec" \
  "llama.cpp pre/dec" "native ratio" "act-q8 ratio" "decode bound"
for t in $types; do
  for th in $threads; do
    np=${best[$t/$th/np]} nd=${best[$t/$th/nd]} nb=${best[$t/$th/nb]}
    ap=${best[$t/$th/ap]:--} ad=${best[$t/$th/ad]:--} lp=${best[$t/$th/lp]:-0} ld=${best[$t/$th/ld]:-0}
    nr="$(ratio "$np" "$lp")/$(ratio "$nd" "$ld")"
    if [ "$ap" = - ]; then ar="-"; else ar="$(ratio "$ap" "$lp")/$(ratio "$ad" "$ld")"; fi
    printf '%-6s %3s | %9s %11s | %9s %11s | %9s %11s | %-13s | %-13s | %s\n' "$t" "$th" "$np" "$nd" "$ap" "$ad" \
      "$lp" "$ld" "$nr" "$ar" "$nb"
  done
done
[ "$have_llamacpp" = 1 ] || echo "(llama.cpp backend not built into $td: its columns are 0)"
