#!/usr/bin/env bash
# tapdiff bench/vulkan_fixtures.sh: the CPU-vs-GPU table. For each fixture
# (and stories260K when ../shared/models has it) x prompt length, the
# three-arm bisect of llamacpp (CPU) vs llamacpp:vulkan with the f64 oracle
# under each arm's declared profile and ref32 under it as control. One line
# per arm and cell: verdict, first divergent tap, its r, the worst r, and the
# out.logits distance to the profile-matched and to the plain oracle.
#
#   bench/vulkan_fixtures.sh [BUILD_DIR]     (default build)
#
# Environment: FIXTURES (comma-separated; default every fixture whose layers
# the arm runs), PROMPTS (default "1 8 40"), STEPS (default 16), THREADS
# (the arms' CPU-side threads, default "1"; "1 2" runs each cell twice),
# FA=1 (or TD_LLAMACPP_FLASH_ATTN=1) for flash attention, STORIES=1 to add
# stories260K to a FIXTURES list (FIXTURES=none STORIES=1: stories260K
# alone). "ties" is how many rounding ties the oracle
# took the arm's side of (harness/ties.h). After each cell a "cell" line
# sums it up: both arms' verdicts and out.logits distances, the ties, the
# CPU seconds of the bisect (user+system, children included: lavapipe runs
# on the CPU, so under load that is the cost to quote, not wall time). A
# weight type an arm cannot run ends its cell in an "unsupported" line
# (bisect exit 77), a tool failure or a crash of the peer in an "error" line
# (a crash: exit 128 + signal and tapdiff's "arm crashed" line). Exit 77 without a
# Vulkan device; otherwise 0 (the table is the result: an arm's verdict is
# in it), or with STRICT=1 (bench/thresholds.sh's Vulkan sweep) 1 when any
# cell is not conformant on both arms or failed.
# Each new weight type compiles its shaders once (minutes on lavapipe).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
td="$PWD/$build/tapdiff"
[ -x "$td" ] || { echo "vulkan_fixtures: no $td (build first: ninja -C $build)" >&2; exit 2; }
if ! "$td" backends 2>/dev/null | grep -q '^llamacpp:vulkan *available'; then
  echo "vulkan_fixtures: the Vulkan arm cannot run here:" >&2
  "$td" backends 2>&1 | grep '^llamacpp:vulkan' >&2 || true
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# qwen3next's recurrent layers are refused by the Vulkan arm
default=$("$td" fixture --list | awk '$2 != "qwen3next" {print $1}' | paste -sd, -)
fixtures=${FIXTURES:-$default}
models=()
if [ "$fixtures" != none ]; then # FIXTURES=none STORIES=1: stories260K alone
  "$td" fixture --out "$work/fx" --only "$fixtures" >/dev/null
  IFS=, read -ra names <<<"$fixtures"
  for f in "${names[@]}"; do models+=("$f=$work/fx/$f.gguf"); done
fi
{ [ -z "${FIXTURES:-}" ] || [ "${STORIES:-0}" = 1 ]; } && [ -r ../shared/models/stories260K.gguf ] &&
  models+=("stories260K=$PWD/../shared/models/stories260K.gguf")
[ "${FA:-0}" = 1 ] && export TD_LLAMACPP_FLASH_ATTN=1
fa=off; [ "${TD_LLAMACPP_FLASH_ATTN:-0}" = 1 ] && fa=on
start=$(date +%s) cells=0 bad=0
: >"$work/bad"
printf '%-20s %-4s %-4s %-16s %-11s %-24s %8s %8s %10s %10s %4s\n' model tok arm name verdict first r worst logits/match logits/plain ties
for mp in "${models[@]}"; do
  name=${mp%%=*} model=${mp#*=}
  for p in ${PROMPTS:-1 8 40}; do
   for th in ${THREADS:-1}; do
    toks=$(seq -s, 1 "$p")
    out="$work/b3"
    rm -rf "$out"
    set +e
    # the llama.cpp arms build qwen4exp's n-gram context on the host: no
    # inp.ple_ids tap, which would count as missing; compare the rest
    filter=()
    [[ $name == qwen4exp* ]] && filter=(--filter "blk.*,out.*,hist.*,inp.tokens,inp.pos,inp.embd,inp.ple_embd,inp.ple_rows")
    /usr/bin/time -f '%U %S' -o "$work/cpu.txt" "$td" bisect --model "$model" --a llamacpp --b llamacpp:vulkan --tokens "$toks" --steps "${STEPS:-16}" \
      --threads "$th" "${filter[@]}" --out-dir "$out" --quiet --json >"$work/j.json" 2>"$work/err.txt"
    rc=$?
    set -e
    cpu=$(awk 'NF == 2 && $1 ~ /^[0-9.]+$/ {printf "%.0f", $1 + $2}' "$work/cpu.txt" 2>/dev/null || true)
    if [ "$rc" -gt 1 ]; then
      what=error; [ "$rc" = 77 ] && what=unsupported
      # a crash of the peer (exit 128 + signal): its own line, not what came before it
      msg=$(grep -m1 'arm crashed' "$work/err.txt" || head -c 300 "$work/err.txt")
      printf '%-20s %-4s %s (bisect exit %d, FA %s, %s threads, %s s CPU): %s\n' "$name" "$p" "$what" "$rc" "$fa" \
        "$th" "${cpu:-?}" "$(printf '%s' "$msg" | head -c 400 | tr '\n' ' ')"
      bad=$((bad + 1)) cells=$((cells + 1))
      continue
    fi
    cells=$((cells + 1))
    python3 - "$work/j.json" "$name" "$p" "$fa" "${cpu:-?}" "$th" "$work/bad" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
def num(x):
    # tapdiff's JSON writes a non-finite ratio as a string ("inf": an integer mismatch)
    try:
        return float(x or 0)
    except (TypeError, ValueError):
        return float("nan")
for arm in ("a", "b"):
    b = j[arm]
    fd = b["compare"].get("first_divergent") or {}
    first = "%s@%s" % (fd["name"], fd["step"]) if fd else "-"
    print("%-20s %-4s %-4s %-16s %-11s %-24s %8.3g %8.3g %10.3g %10.3g %4d" % (
        sys.argv[2], sys.argv[3], arm, b["arm"], b["verdict"], first, num(fd.get("ratio")),
        num(b.get("worst_ratio")), num(b.get("logits_vs_oracle")), num(b.get("logits_vs_plain_oracle")),
        b.get("oracle_ties_taken") or 0))
a, b = j["a"], j["b"]
fd = b["compare"].get("first_divergent") or {}
first = "%s step %s r %.3g" % (fd["name"], fd["step"], num(fd.get("ratio"))) if fd else "-"
print("cell %s %s FA %s threads %s: cpu %s %.3g (%.3g) | vulkan %s %.3g (%.3g) first %s ties %d | %s s CPU" % (
    sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[6], a["verdict"], num(a.get("logits_vs_oracle")),
    num(a.get("logits_vs_plain_oracle")), b["verdict"], num(b.get("logits_vs_oracle")),
    num(b.get("logits_vs_plain_oracle")), first, b.get("oracle_ties_taken") or 0, sys.argv[5]))
if a["verdict"] != "conformant" or b["verdict"] != "conformant":
    open(sys.argv[7], "a").write("x\n")
PY
   done
  done
done
bad=$((bad + $(wc -l <"$work/bad")))
echo "vulkan_fixtures: ${#models[@]} models, FA $fa, prompts ${PROMPTS:-1 8 40}, threads ${THREADS:-1}, ${STEPS:-16} steps," \
  "$cells cells, $bad not conformant or failed, $(( $(date +%s) - start )) s"
# STRICT=1 (the false-alarm sweep): the exit status is the verdict
[ "${STRICT:-0}" = 1 ] && [ "$bad" -gt 0 ] && exit 1
exit 0
