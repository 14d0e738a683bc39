#!/usr/bin/env bash
# tapdiff bench/ref_threads.sh: how much a second reference thread can give,
# measured in CPU time so that it survives a busy machine. With
# TD_REF_POOL_STATS=1 the reference's pool prints the CPU time of the work
# outside its jobs and the critical path (outside + the slowest worker of
# each job); the speedup is critical path at 1 thread / at N threads. It
# leaves out the wake-up latency of the helpers (tens of microseconds per job
# on an idle machine; the job count is printed) and counts memory stalls as
# work. Wall times and the load average are printed beside it.
#
#   bench/ref_threads.sh [BUILD_DIR]   (default build)
#
# MODEL (default out/bench/bench-q8_0.gguf, made when missing), BACKEND (ref),
# THREADS (2), STEPS (16), TOKENS (an 8-token prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
td="$build/tapdiff"
[ -x "$td" ] || { echo "ref_threads: no $td" >&2; exit 2; }
m=${MODEL:-out/bench/bench-q8_0.gguf}
if [ ! -f "$m" ]; then
  mkdir -p "$(dirname "$m")"
  "$td" bench --make-model "$m" --type Q8_0 >/dev/null
fi
crit() { # threads -> "critical_s jobs wall_s"
  local line wall
  line=$( { TD_REF_POOL_STATS=1 /usr/bin/time -f "wall %e" "$td" run --model "$m" --backend "${BACKEND:-ref}" \
    --tokens "${TOKENS:-1,2,3,4,5,6,7,8}" --steps "${STEPS:-16}" --threads "$1" --quiet >/dev/null; } 2>&1)
  wall=$(grep '^wall' <<<"$line" | awk '{print $2}')
  grep 'reference pool' <<<"$line" | sed -E 's/.* ([0-9]+) jobs.*critical path ([0-9.]+).*/\2 \1/' | awk -v w="$wall" '{print $1, $2, w}'
}
read -r c1 j1 w1 < <(crit 1)
read -r cn jn wn < <(crit "${THREADS:-2}")
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "1 thread: critical path ${c1} CPU s, ${j1} jobs, wall ${w1} s"
echo "${THREADS:-2} threads: critical path ${cn} CPU s, ${jn} jobs, wall ${wn} s"
python3 -c "import sys; print('speedup (CPU critical path): %.2fx' % (float(sys.argv[1]) / float(sys.argv[2])))" "$c1" "$cn"
