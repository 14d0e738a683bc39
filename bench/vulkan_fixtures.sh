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
# the arm runs), PROMPTS (default "1 8 40"), STEPS (default 16),
# TD_LLAMACPP_FLASH_ATTN=1 for flash attention, STORIES=1 to add stories260K
# to a FIXTURES list. "ties" is how many rounding ties the oracle took the
# arm's side of (harness/ties.h). Exit 77 without a Vulkan
# device; otherwise 0 (the table is the result: an arm's verdict is in it).
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
"$td" fixture --out "$work/fx" --only "$fixtures" >/dev/null
models=()
IFS=, read -ra names <<<"$fixtures"
for f in "${names[@]}"; do models+=("$f=$work/fx/$f.gguf"); done
{ [ -z "${FIXTURES:-}" ] || [ "${STORIES:-0}" = 1 ]; } && [ -r ../shared/models/stories260K.gguf ] &&
  models+=("stories260K=$PWD/../shared/models/stories260K.gguf")
start=$(date +%s)
printf '%-20s %-4s %-4s %-16s %-11s %-24s %8s %8s %10s %10s %4s\n' model tok arm name verdict first r worst logits/match logits/plain ties
for mp in "${models[@]}"; do
  name=${mp%%=*} model=${mp#*=}
  for p in ${PROMPTS:-1 8 40}; do
    toks=$(seq -s, 1 "$p")
    out="$work/b3"
    rm -rf "$out"
    set +e
    # the llama.cpp arms build qwen4exp's n-gram context on the host: no
    # inp.ple_ids tap, which would count as missing; compare the rest
    filter=()
    [[ $name == qwen4exp* ]] && filter=(--filter "blk.*,out.*,hist.*,inp.tokens,inp.pos,inp.embd,inp.ple_embd,inp.ple_rows")
    "$td" bisect --model "$model" --a llamacpp --b llamacpp:vulkan --tokens "$toks" --steps "${STEPS:-16}" \
      --threads 1 "${filter[@]}" --out-dir "$out" --quiet --json >"$work/j.json" 2>"$work/err.txt"
    rc=$?
    set -e
    if [ "$rc" -gt 1 ]; then
      printf '%-20s %-4s exit %d: %s\n' "$name" "$p" "$rc" "$(head -c 200 "$work/err.txt" | tr '\n' ' ')"
      continue
    fi
    python3 - "$work/j.json" "$name" "$p" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for arm in ("a", "b"):
    b = j[arm]
    fd = b["compare"].get("first_divergent") or {}
    first = "%s@%s" % (fd["name"], fd["step"]) if fd else "-"
    print("%-20s %-4s %-4s %-16s %-11s %-24s %8.3g %8.3g %10.3g %10.3g %4d" % (
        sys.argv[2], sys.argv[3], arm, b["arm"], b["verdict"], first, fd.get("ratio") or 0,
        b.get("worst_ratio") or 0, b.get("logits_vs_oracle") or 0, b.get("logits_vs_plain_oracle") or 0,
        b.get("oracle_ties_taken") or 0))
PY
  done
done
echo "vulkan_fixtures: ${#models[@]} models, prompts ${PROMPTS:-1 8 40}, ${STEPS:-16} steps, $(( $(date +%s) - start )) s"
