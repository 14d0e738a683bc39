#!/usr/bin/env bash
# tapdiff bench/side_by_side.sh: our cpu backend and llama.cpp on the same
# GGUF files and the same thread counts, and the ratios.
#
#   bench/side_by_side.sh [BUILD_DIR]     (default build)
#
# Writes the benchmark models (llama arch, ~200M parameters, Q4_K, Q8_0,
# F16) into out/bench/ (ignored by git) when they are missing, then runs
# `tapdiff bench` for every (model, threads, arm) and prints one table:
# prefill and decode tokens/s of each arm, ours / llama.cpp, and the decode
# memory-bandwidth bound. Arms:
#   cpu native   our cpu backend, f32 activations;
#   cpu act-q8   8-bit activations for quantized weights, as llama.cpp;
#   llama.cpp user     llama.cpp as a user gets it, as llama-bench runs it:
#                weight repacking on, flash attention auto, f16 KV cache,
#                and the CPU variant ggml itself picks for this CPU
#                (TD_LLAMACPP_CPU_VARIANT=auto TD_LLAMACPP_USER_DEFAULTS=1);
#   llama.cpp aligned  the configuration conformance runs compare against
#                (tapdiff's llamacpp backend as is: pinned variant, no
#                repacking, flash attention off, f32 KV cache).
# The ratios are ours / llama.cpp user (the acceptance numbers of issue 18)
# and ours / llama.cpp aligned. Every arm computes the logits of the last
# prompt position only, as llama-bench (LOGITS=all: every position). The
# kernel level (ISA) each side ran is printed under the table.
# Each number is the best of REPEAT runs after a warm-up, and the whole grid
# is run ROUNDS times (default 2), each cell keeping its best value: arms
# run one after another, so a busy spell on a shared machine spoils one pass.
# Environment: PROMPT (default 64), GEN (default 32), REPEAT (default 3),
# ROUNDS (default 2), THREADS (default "1 2"), TYPES (default "q4_k q8_0
# f16"), LOGITS (last or all, default last), TD_CPU_ISA (our kernel level
# cap, as the backend reads it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
td="$build/tapdiff"
[ -x "$td" ] || { echo "side_by_side: no $td (build first: meson setup $build && ninja -C $build)" >&2; exit 2; }
prompt=${PROMPT:-64} gen=${GEN:-32} repeat=${REPEAT:-3} rounds=${ROUNDS:-2}
threads=${THREADS:-"1 2"} types=${TYPES:-"q4_k q8_0 f16"} logits=${LOGITS:-last}
case "$logits" in last) last=(--logits-last) ;; all) last=() ;; *) echo "side_by_side: LOGITS must be last or all" >&2; exit 2 ;; esac
mkdir -p out/bench

# 77: tapdiff knows the backend but this build lacks it (checked before the model is read)
have_llamacpp=1 rc=0
"$td" bench --model /dev/null --backend llamacpp >/dev/null 2>&1 || rc=$?
[ "$rc" = 77 ] && have_llamacpp=0

for t in $types; do
  f="out/bench/bench-$t.gguf"
  [ -f "$f" ] || "$td" bench --make-model "$f" --type "$t" >/dev/null
done

declare -A best version
# one bench run -> P D B (prefill, decode, decode bound; tok/s) and its
# version string in version[arm] (no subshell, so the globals survive)
run() { # arm model backend threads [profile]
  local extra=() json
  [ -n "${5:-}" ] && extra=(--profile "$5")
  json=$("$td" bench --model "$2" --backend "$3" --threads "$4" --prompt-len "$prompt" --gen "$gen" \
    --repeat "$repeat" --json "${last[@]}" "${extra[@]}" 2>/dev/null)
  version[$1]=$(printf '%s' "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["backend_version"])')
  read -r P D B < <(printf '%s' "$json" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f %.2f %.2f" % (d["prefill_tok_s"], d["decode_tok_s"], d["decode_bound_tok_s"]))')
}
user_run() {
  local v=${TD_LLAMACPP_CPU_VARIANT-} u=${TD_LLAMACPP_USER_DEFAULTS-}
  export TD_LLAMACPP_CPU_VARIANT=auto TD_LLAMACPP_USER_DEFAULTS=1
  run "$@"
  if [ -n "$v" ]; then export TD_LLAMACPP_CPU_VARIANT=$v; else unset TD_LLAMACPP_CPU_VARIANT; fi
  if [ -n "$u" ]; then export TD_LLAMACPP_USER_DEFAULTS=$u; else unset TD_LLAMACPP_USER_DEFAULTS; fi
}

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print('%.2f' % (a/b) if b > 0 else '-')" "$1" "$2"; }

# best (largest) value of each cell over ROUNDS passes of the whole grid
keep() { # key value
  if [ -z "${best[$1]:-}" ] || python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$2" "${best[$1]}"; then
    best[$1]=$2
  fi
}
for ((r = 1; r <= rounds; r++)); do
  for t in $types; do
    f="out/bench/bench-$t.gguf"
    for th in $threads; do
      run cpu "$f" cpu "$th"; keep "$t/$th/np" "$P"; keep "$t/$th/nd" "$D"; keep "$t/$th/nb" "$B"
      if [ "$t" != f16 ]; then run cpu "$f" cpu "$th" act-q8; keep "$t/$th/ap" "$P"; keep "$t/$th/ad" "$D"; fi
      if [ "$have_llamacpp" = 1 ]; then
        user_run user "$f" llamacpp "$th"; keep "$t/$th/up" "$P"; keep "$t/$th/ud" "$D"
        run aligned "$f" llamacpp "$th"; keep "$t/$th/lp" "$P"; keep "$t/$th/ld" "$D"
      fi
    done
  done
done

echo "prompt $prompt tokens, $gen decode steps, logits of the $logits position(s), best of $repeat runs x $rounds rounds;"
echo "tok/s; ratios = ours / llama.cpp as pre/dec"
printf '%-5s %3s | %-17s | %-17s | %-17s | %-17s | %-11s | %-11s | %-11s | %-11s | %s\n' type thr "cpu native" \
  "cpu act-q8" "llama.cpp user" "llama.cpp aligned" "nat/user" "q8/user" "nat/aligned" "q8/aligned" "decode bound"
for t in $types; do
  for th in $threads; do
    np=${best[$t/$th/np]} nd=${best[$t/$th/nd]} nb=${best[$t/$th/nb]}
    ap=${best[$t/$th/ap]:--} ad=${best[$t/$th/ad]:--}
    up=${best[$t/$th/up]:-0} ud=${best[$t/$th/ud]:-0} lp=${best[$t/$th/lp]:-0} ld=${best[$t/$th/ld]:-0}
    nu="$(ratio "$np" "$up")/$(ratio "$nd" "$ud")" nl="$(ratio "$np" "$lp")/$(ratio "$nd" "$ld")"
    if [ "$ap" = - ]; then au="-" al="-"; else
      au="$(ratio "$ap" "$up")/$(ratio "$ad" "$ud")" al="$(ratio "$ap" "$lp")/$(ratio "$ad" "$ld")"; fi
    printf '%-5s %3s | %7s %9s | %7s %9s | %7s %9s | %7s %9s | %-11s | %-11s | %-11s | %-11s | %s\n' "$t" "$th" \
      "$np" "$nd" "$ap" "$ad" "$up" "$ud" "$lp" "$ld" "$nu" "$au" "$nl" "$al" "$nb"
  done
done
# the ISA each side ran: our kernel level, llama.cpp's variant (and the features ggml reports)
echo "cpu:               $(printf '%s' "${version[cpu]:-}" | grep -o 'kernels [a-z0-9]*' || true)"
if [ "$have_llamacpp" = 1 ]; then
  echo "llama.cpp user:    $(printf '%s' "${version[user]:-}" | grep -o 'ggml-cpu-[^,]*' || true)"
  echo "llama.cpp aligned: $(printf '%s' "${version[aligned]:-}" | grep -o 'ggml-cpu-[^,]*' || true)"
else
  echo "(llama.cpp backend not built into $td: its columns are 0)"
fi
