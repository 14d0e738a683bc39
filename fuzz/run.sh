#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan + coverage) in
# build-fuzz/, makes seed corpora with tapdiff's own writers, and runs each
# target for SECONDS (default 25; CI uses the default, a long run e.g. 3600).
# Exit status: 0 no finding, 1 a finding (crash, sanitizer report, leak or
# timeout: libFuzzer's artifact is left in build-fuzz/findings/), 77 clang or
# libFuzzer not available. crash-* files without a non-zero exit come from
# fuzz_tapfile's forked checker: its crash on a hostile file is the refusal.
# usage: fuzz/run.sh [SECONDS] [JOBS]
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-25}
jobs=${2:-1}
command -v clang >/dev/null || { echo "fuzz/run.sh: clang not installed (apt-get install clang libclang-rt-14-dev)"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >/tmp/td_fz_probe.c
clang -fsanitize=fuzzer /tmp/td_fz_probe.c -o /tmp/td_fz_probe 2>/dev/null ||
  { echo "fuzz/run.sh: clang cannot link -fsanitize=fuzzer (apt-get install libclang-rt-14-dev)"; exit 77; }
b=build-fuzz
if [ ! -f $b/build.ninja ]; then
  CC=clang meson setup $b -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized \
    -Dwerror=false -Dtests=disabled -Dllamacpp=disabled -Dcuda=disabled >/dev/null || exit 1
fi
ninja -C $b fuzz/fuzz_tapfile fuzz/fuzz_gguf tapdiff >/dev/null || exit 1
td=$b/tapdiff
c=$b/corpus
mkdir -p $c/tapfile $c/gguf $c/fx $b/findings
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp
# Seeds: the two smallest fixtures; tap files of every kind the writers make.
$td fixture --out $c/fx --only llama-f32,qwen3moe-q8_0 >/dev/null || exit 1
cp $c/fx/*.gguf $c/gguf/
m=$c/fx/qwen3moe-q8_0.gguf
$td run --model $m --backend ref --tokens 1,15 --steps 1 --taps fingerprint --out $c/tapfile/fp.h5 >/dev/null &&
  $td run --model $m --backend ref32 --tokens 1,15 --steps 2 --taps 'inp.*,out.logits,blk.0.moe_*,hist.*' \
    --out $c/tapfile/some.h5 >/dev/null &&
  $td golden --model $m --tokens 1,15 --steps 1 --logits-only --out $c/tapfile/golden.h5 >/dev/null || exit 1
# Inputs that once were findings start every run.
cp fuzz/regress/tapfile/* $c/tapfile/
status=0
for t in fuzz_tapfile fuzz_gguf; do
  log=$b/findings/$t.log
  par=()
  # -jobs writes fuzz-N.log into the current directory: keep them in findings/.
  [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
  (cd $b/findings && ../fuzz/$t ../corpus/${t#fuzz_} ${par[@]+"${par[@]}"} -max_total_time="$secs" -timeout=30 \
    -rss_limit_mb=4096 -max_len=4000000 -artifact_prefix=$t- -print_final_stats=1) >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1)
  echo "fuzz/run.sh: $t: ${secs}s, ${execs:-?} executions, ${cov:-cov: ?}, ${ft:-ft: ?}, exit $rc"
  if [ $rc -ne 0 ]; then
    status=1
    grep -m5 -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log"
  fi
done
exit $status
