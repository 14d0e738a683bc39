#!/usr/bin/env bash
# tapdiff bench/compare_speed.sh: `tapdiff compare` throughput on real tap
# files, in MB of the two files per CPU second (user + sys of compare and of
# the checker processes it forks: /usr/bin/time counts waited-for children),
# so it holds on a busy machine. Best of ROUNDS (default 3). The wall time
# (best of the same rounds) follows as a secondary number: it depends on the
# machine's load (the checkers of A and B run at once, on two cores if free).
#
#   bench/compare_speed.sh [BUILD_DIR] [STEPS...]     (default build; 16 64)
#
# Pairs in out/perf/ (made when missing): bench-q8_0 (bench/side_by_side.sh's
# model, out/bench/), a 64-token prompt + STEPS greedy steps, cpu native (A)
# against cpu act-q8 pinned to A's tokens (B), one thread, as `tapdiff run`
# writes them (stored, contiguous), and the same files deflated
# (`h5repack -m 4096 -f SHUF -f GZIP=4`, Debian hdf5-tools; skipped without
# it). BEFORE=/path/to/an/older/tapdiff measures it on the same pairs,
# interleaved, and checks that both print the same bytes (text, --json and
# --report's report.json): "outputs identical" or the differing output.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(16 64)
td="$build/tapdiff"
[ -x "$td" ] || { echo "compare_speed: no $td" >&2; exit 2; }
d=out/perf
mkdir -p "$d" out/bench
m=out/bench/bench-q8_0.gguf
[ -f "$m" ] || "$td" bench --make-model "$m" --type q8_0 >/dev/null
toks=$(seq -s, 1 64)
pairs=()
for s in "${steps[@]}"; do
  a=$d/q8-$s-a.h5 b=$d/q8-$s-b.h5
  [ -f "$a" ] || "$td" run --model "$m" --backend cpu --threads 1 --tokens "$toks" --steps "$s" --out "$a" --quiet
  [ -f "$b" ] || "$td" run --model "$m" --backend cpu --threads 1 --profile act-q8 --tokens "$toks" --steps "$s" \
    --decode "pinned:$a" --out "$b" --quiet
  pairs+=("$a $b")
  if command -v h5repack >/dev/null; then
    for x in a b; do
      [ -f "$d/q8-$s-$x.z.h5" ] || h5repack -m 4096 -f SHUF -f GZIP=4 "$d/q8-$s-$x.h5" "$d/q8-$s-$x.z.h5"
    done
    pairs+=("$d/q8-$s-a.z.h5 $d/q8-$s-b.z.h5")
  fi
done
tf=$(mktemp)
trap 'rm -f "$tf"' EXIT
# "CPU WALL" of one run (user + sys incl. waited-for children; elapsed)
cput() { /usr/bin/time -o "$tf" -f "%U %S %e" "$@" >/dev/null 2>&1 || true; tail -1 "$tf" | awk '{print $1 + $2, $3}'; }
lesser() { python3 -c "import sys; print(min(float(x) for x in sys.argv[1:] if x))" "$@"; }
mbs() { python3 -c "import sys; print('%.1f' % (float(sys.argv[1]) / 1e6 / float(sys.argv[2])))" "$1" "$2"; }
same() { # tapdiff-new tapdiff-old A B
  local t
  t=$(mktemp -d)
  for v in new old; do
    local x=$1
    [ $v = old ] && x=$2
    "$x" compare "$3" "$4" >"$t/$v.txt" 2>&1 || true
    "$x" compare "$3" "$4" --json >"$t/$v.json" 2>&1 || true
    "$x" compare "$3" "$4" --report "$t/$v" >/dev/null 2>&1 || true
  done
  local out="outputs identical"
  cmp -s "$t/new.txt" "$t/old.txt" || out="TEXT DIFFERS"
  cmp -s "$t/new.json" "$t/old.json" || out="$out; JSON DIFFERS"
  cmp -s "$t/new/report.json" "$t/old/report.json" || out="$out; REPORT.JSON DIFFERS"
  rm -rf "$t"
  echo "$out"
}
for p in "${pairs[@]}"; do
  read -r a b <<<"$p"
  bytes=$(($(stat -c %s "$a") + $(stat -c %s "$b")))
  line="$(basename "$a") + $(basename "$b") ($((bytes / 1000000)) MB):"
  t= tb= w= wb=
  for ((r = 1; r <= ${ROUNDS:-3}; r++)); do # interleaved: both see the same load
    if [ -n "${BEFORE:-}" ]; then
      read -r c e <<<"$(cput "$BEFORE" compare "$a" "$b")"
      tb=$(lesser "$c" $tb) wb=$(lesser "$e" $wb)
    fi
    read -r c e <<<"$(cput "$td" compare "$a" "$b")"
    t=$(lesser "$c" $t) w=$(lesser "$e" $w)
  done
  [ -n "${BEFORE:-}" ] && line="$line before ${tb} s $(mbs "$bytes" "$tb") MB/s (wall ${wb} s),"
  line="$line ${t} s CPU, $(mbs "$bytes" "$t") MB/s (wall ${w} s)"
  [ -n "${BEFORE:-}" ] && line="$line; $(same "$td" "$BEFORE" "$a" "$b")"
  echo "$line"
done
