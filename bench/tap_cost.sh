#!/usr/bin/env bash
# tapdiff bench/tap_cost.sh: what taps cost a run, in CPU time (user + sys
# from /usr/bin/time, so it holds on a busy machine): `tapdiff run` on
# bench-q8_0 (bench/side_by_side.sh's model, out/bench/), a 64-token prompt
# + STEPS (default 16) greedy steps, one thread, with --taps none,
# fingerprint and full; best of ROUNDS (default 3), interleaved; each line
# gives the CPU seconds and the ratio to the untapped run.
#
#   bench/tap_cost.sh [BUILD_DIR]     (default build; BACKEND default cpu)
#
# BEFORE=/path/to/an/older/tapdiff measures it too, interleaved, and checks
# that both write fingerprint files with the same taps (names, shapes and
# fingerprints: tapdiff compare of the two files must be conformant with
# every tap's error 0).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
td="$build/tapdiff"
[ -x "$td" ] || { echo "tap_cost: no $td" >&2; exit 2; }
mkdir -p out/bench out/perf
m=out/bench/bench-q8_0.gguf
[ -f "$m" ] || "$td" bench --make-model "$m" --type q8_0 >/dev/null
toks=$(seq -s, 1 64)
steps=${STEPS:-16}
backend=${BACKEND:-cpu}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cput() { /usr/bin/time -f "%U %S" "$@" 2>&1 >/dev/null | tail -1 | awk '{print $1 + $2}'; }
lesser() { python3 -c "import sys; print(min(float(x) for x in sys.argv[1:] if x))" "$@"; }
run() { # tapdiff mode out
  local o=(--out "$3")
  [ "$2" = none ] && o=()
  cput "$1" run --model "$m" --backend "$backend" --threads 1 --tokens "$toks" --steps "$steps" --taps "$2" \
    "${o[@]}" --quiet
}
declare -A best
arms=(new)
[ -n "${BEFORE:-}" ] && arms+=(old)
for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
  for mode in none fingerprint full; do
    for arm in "${arms[@]}"; do
      x=$td
      [ "$arm" = old ] && x=$BEFORE
      best[$arm.$mode]=$(lesser "$(run "$x" "$mode" "$out/$arm-$mode.h5")" ${best[$arm.$mode]:-})
    done
  done
done
for arm in "${arms[@]}"; do
  base=${best[$arm.none]}
  line="$arm: none ${base} s"
  for mode in fingerprint full; do
    line="$line, $mode ${best[$arm.$mode]} s ($(python3 -c "import sys; print('%.2fx' % (float(sys.argv[1]) / float(sys.argv[2])))" \
      "${best[$arm.$mode]}" "$base"))"
  done
  echo "$line"
done
if [ -n "${BEFORE:-}" ]; then
  for mode in fingerprint full; do
    /usr/bin/python3 - "$out/old-$mode.h5" "$out/new-$mode.h5" "$mode" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def same(x, y):
    return np.asarray(x).tobytes() == np.asarray(y).tobytes()
bad, n = [], 0
if list(a["steps"]) != list(b["steps"]):
    bad.append("step lists")
for s in a["steps"]:
    ga, gb = a["steps"][s], b["steps"][s]
    if list(ga) != list(gb) or dict(ga.attrs).keys() != dict(gb.attrs).keys():
        bad.append(s)
        continue
    for k in ga.attrs:
        if not same(ga.attrs[k], gb.attrs[k]): bad.append(s + "@" + k)
    for t in ga:
        n += 1
        da, db = ga[t], gb[t]
        if sorted(da.attrs) != sorted(db.attrs) or da.shape != db.shape or da.dtype != db.dtype:
            bad.append(s + "/" + t)
            continue
        for k in da.attrs:
            if not same(da.attrs[k], db.attrs[k]): bad.append(s + "/" + t + "@" + k)
        if da.shape is not None and not same(da[()], db[()]): bad.append(s + "/" + t + " data")
print("%s files: %s" % (sys.argv[3], "%d taps identical (attributes, fingerprints, data)" % n if not bad
                         else "DIFFER: " + " ".join(bad[:10])))
PY
  done
fi
