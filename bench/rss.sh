#!/usr/bin/env bash
# tapdiff bench/rss.sh: peak resident memory (the "Maximum resident set size"
# of /usr/bin/time -v) against the number of decode steps, for the verbs
# that must hold O(one step) whatever the file length (README "Reliability").
# Model: the qwen3moe-q8_0 fixture (context 512), prompt 1,15,20,7; tap files
# of the reference (ref) and ref32 with every tap, in out/rss/.
#
#   bench/rss.sh [BUILD_DIR] [STEPS...]     (default build; 10 200 508)
#
# Prints one line per measurement: verb, steps, peak RSS in KB. `compare`
# exits 1 here (ref32 is outside ref's f64 budget on some taps): that is its
# verdict, not a failure of the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(10 200 508)
td="$build/tapdiff"
[ -x "$td" ] || { echo "rss: no $td" >&2; exit 2; }
d=out/rss
mkdir -p "$d"
m=$d/fx/qwen3moe-q8_0.gguf
[ -f "$m" ] || "$td" fixture --out "$d/fx" --only qwen3moe-q8_0 >/dev/null
peak() { # label command...: the peak RSS in KB of the command
  local label=$1 kb f
  shift
  f=$(mktemp)
  /usr/bin/time -v -o "$f" "$@" >/dev/null 2>&1 || true
  kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$f")
  rm -f "$f"
  printf '%-28s %8s KB\n' "$label" "$kb"
}
for s in "${steps[@]}"; do
  for b in ref ref32; do
    [ -f "$d/$b-$s.h5" ] || "$td" run --model "$m" --backend $b --tokens 1,15,20,7 --steps "$s" --out "$d/$b-$s.h5" >/dev/null
  done
done
for s in "${steps[@]}"; do
  peak "run (taps: all) $s" "$td" run --model "$m" --backend ref --tokens 1,15,20,7 --steps "$s" --out "$d/run.h5"
  peak "run --taps none $s" "$td" run --model "$m" --backend ref --tokens 1,15,20,7 --steps "$s" --taps none
  peak "compare $s" "$td" compare "$d/ref-$s.h5" "$d/ref32-$s.h5"
  peak "compare --json $s" "$td" compare "$d/ref-$s.h5" "$d/ref32-$s.h5" --json
  peak "audit $s" "$td" audit "$d/ref-$s.h5"
done
rm -f "$d/run.h5"
