#!/usr/bin/env bash
# The main job on the built-in default model: installs, builds, writes the
# fixture models, validates the default one, and runs the f64 reference and
# its f32 twin over a prefill + 16 greedy decode steps with full taps, then
# bisects the optimized cpu backend against ref (control ref32) (verdict + HTML report) and audits router ties.
# Results land in out/. usage: ci/demo.sh [FIXTURE]   (default: qwen3moe-f32)
set -euo pipefail
cd "$(dirname "$0")/.."
fixture=${1:-qwen3moe-f32}

bash ci/setup.sh
bash ci/build.sh build
td=build/tapdiff
mkdir -p out

echo "== tapdiff fixture: writing the deterministic fixture models to out/fixtures"
$td fixture --out out/fixtures
model=out/fixtures/$fixture.gguf

echo
echo "== tapdiff inspect $model"
$td inspect "$model"

for arm in ref ref32; do
  echo
  echo "== tapdiff run --backend $arm (prefill of 8 tokens + 16 greedy decode steps, full taps)"
  $td run --model "$model" --backend $arm --tokens 1,20,30,40,50,60,70,80 --steps 16 \
    --decode greedy --taps full --out out/$arm.h5
done

echo
echo "== tapdiff bisect --a ref --b cpu (the optimized cpu arm against the f64 reference, pinned to the same tokens; control ref32; reports)"
$td bisect --model "$model" --a ref --b cpu --tokens 1,20,30,40,50,60,70,80 --steps 16 --out-dir out/bisect

echo
echo "== tapdiff audit out/ref.h5 --control out/ref32.h5 (router tie audit of the MoE layers)"
$td audit out/ref.h5 --control out/ref32.h5

echo
echo "demo: wrote out/fixtures/*.gguf, out/ref.h5 (f64 reference taps), out/ref32.h5 (f32 twin),"
echo "      out/bisect/ (tap files + report/report.html)."
echo "      Read a tap with h5py, e.g. /usr/bin/python3 -c \"import h5py; f=h5py.File('out/ref.h5'); print(f['steps/000000/out.logits'][0,:8])\""
