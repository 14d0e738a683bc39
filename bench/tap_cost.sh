#!/usr/bin/env bash
# tapdiff bench/tap_cost.sh: what taps cost a run: `tapdiff run` on
# bench-q8_0 (bench/side_by_side.sh's model, out/bench/), a 64-token prompt
# + STEPS (default 16) greedy steps, one thread, with --taps none,
# fingerprint and full, the tapped ones with the sink's writer thread (the
# default) and without it (TAPDIFF_TAP_THREAD=0, "inline"); best of ROUNDS
# (default 3), interleaved. Each line gives
#   CPU time (user + sys from /usr/bin/time: holds on a busy machine),
#   wall time (what the writer thread is for; meaningful only on an idle
#   machine: the load average before and after is printed beside it),
#   peak RSS (max over the rounds),
# and the ratios of CPU and wall time to the untapped run; with the writer
# thread also the engine thread's CPU time (the run's less the writer's,
# TD_TAPS_STATS=1) and its ratio: the wall time of a machine with a core
# free for the writer, as long as the writer keeps up (its CPU time below
# the engine's; then the engine never waits).
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
# "cpu wall rss_kb writer_cpu" of one run (writer_cpu: the sink's writer thread, TD_TAPS_STATS; 0 without one)
measure() {
  local e
  e=$(TD_TAPS_STATS=1 /usr/bin/time -f "%U %S %e %M" "$@" 2>&1 >/dev/null)
  echo "$(tail -1 <<<"$e" | awk '{print $1 + $2, $3, $4}') $(grep -o 'thread cpu [0-9.]*' <<<"$e" | awk '{print $3}' || true)"
}
lesser() { python3 -c "import sys; print(min(float(x) for x in sys.argv[1:] if x))" "$@"; }
greater() { python3 -c "import sys; print(int(max(float(x) for x in sys.argv[1:] if x)))" "$@"; }
run() { # tapdiff mode out
  local o=(--out "$3") mode=${2%-inline} env=()
  [ "$mode" = none ] && o=()
  [ "$mode" != "$2" ] && env=(TAPDIFF_TAP_THREAD=0)
  measure env ${env[@]+"${env[@]}"} "$1" run --model "$m" --backend "$backend" --threads 1 --tokens "$toks" \
    --steps "$steps" --taps "$mode" "${o[@]}" --quiet
}
declare -A cpu wall rss eng
arms=(new)
[ -n "${BEFORE:-}" ] && arms+=(old)
modes=(none fingerprint full fingerprint-inline full-inline)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
  for mode in "${modes[@]}"; do
    for arm in "${arms[@]}"; do
      x=$td
      [ "$arm" = old ] && x=$BEFORE
      # an older build has no writer thread: its inline runs are its only ones
      [ "$arm" = old ] && [ "$mode" != "${mode%-inline}" ] && continue
      read -r c w k t < <(run "$x" "$mode" "$out/$arm-$mode.h5")
      # the engine's thread: what is left of the CPU time without the writer's
      eng[$arm.$mode]=$(lesser "$(python3 -c "print($c - ${t:-0})")" ${eng[$arm.$mode]:-})
      cpu[$arm.$mode]=$(lesser "$c" ${cpu[$arm.$mode]:-})
      wall[$arm.$mode]=$(lesser "$w" ${wall[$arm.$mode]:-})
      rss[$arm.$mode]=$(greater "$k" ${rss[$arm.$mode]:-})
    done
  done
done
echo "load average before: $load0; after: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; rounds ${ROUNDS:-3}"
ratio() { python3 -c "import sys; print('%.2fx' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$2"; }
for arm in "${arms[@]}"; do
  for mode in "${modes[@]}"; do
    [ -n "${cpu[$arm.$mode]:-}" ] || continue
    line=$(printf '%s %-18s cpu %5.2f s  wall %5.2f s  peak RSS %6.1f MB' "$arm" "$mode" "${cpu[$arm.$mode]}" \
      "${wall[$arm.$mode]}" "$(python3 -c "print(${rss[$arm.$mode]} / 1024)")")
    [ "$mode" != none ] && line="$line  ($(ratio "${cpu[$arm.$mode]}" "${cpu[$arm.none]}") cpu, $(ratio \
      "${wall[$arm.$mode]}" "${wall[$arm.none]}") wall)"
    [ "$mode" != none ] && [ "${eng[$arm.$mode]}" != "${cpu[$arm.$mode]}" ] &&
      line="$line  engine thread $(printf '%.2f' "${eng[$arm.$mode]}") s ($(ratio "${eng[$arm.$mode]}" "${cpu[$arm.none]}"))"
    echo "$line"
  done
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
