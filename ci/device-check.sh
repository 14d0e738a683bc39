#!/usr/bin/env bash
# Device check of the llama.cpp GPU arms: the Vulkan arm (and the CUDA arm
# where its library is present) through the conformance set, one short table.
#
# The device machine has a GPU, its driver, nvcc, meson and ninja, but not
# HDF5, cJSON or OpenBLAS, and no network. So the check runs a bundle made
# here, carried with the working tree (out/ is ignored by git):
#
#   ci/device-check.sh --pack      (here) builds build-device/ without OpenBLAS
#                                  or tests and packs tapdiff, the shared
#                                  libraries it needs beyond glibc, llama.cpp's
#                                  CPU + Vulkan libraries (+ CUDA when fetched
#                                  with --cuda), the Vulkan loader, stories260K
#                                  and four fixtures into out/device-bundle.tar.xz
#   ci/device-check.sh             (there) unpacks it into out/device/ and runs
#                                  the set; exit 0 when every cell ran and every
#                                  one-token-prompt row is conformant.
#
# Conformance set: models stories260K, llama-f32, llama-q8_0, qwen3-q4_k;
# prompts of 1, 8 and 40 tokens; 16 decode steps; three-arm bisect
# (A = llamacpp on the CPU, B = the GPU arm, oracle ref with each arm's
# profile). Sized to finish in under 8 minutes (each cell is bounded).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=out/device-bundle.tar.xz

if [ "${1:-}" = "--pack" ]; then
  set -e
  [ -f build-device/build.ninja ] || meson setup build-device -Dopenblas=disabled -Dtests=disabled -Dwerror=true >/dev/null
  ninja -C build-device -j2 >/dev/null
  st=$(mktemp -d)
  mkdir -p "$st/lib" "$st/llama" "$st/models"
  cp build-device/tapdiff "$st/"
  # every shared library tapdiff loads except glibc's own
  ldd build-device/tapdiff | awk '$3 ~ /^\// {print $3}' | while read -r l; do
    case "$(basename "$l")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
      *) cp -L "$l" "$st/lib/" ;;
    esac
  done
  v=$(TD_LLAMACPP_CPU_VARIANT= build-device/tapdiff backends | awk '$1=="llamacpp"{print $4}' | sed 's/ggml-cpu-//')
  cp -L .deps/llamacpp/lib/libggml-cpu-"${v:-haswell}".so .deps/llamacpp/lib/libggml-cpu-x64.so "$st/llama/"
  cp -L .deps/llamacpp-vulkan/lib/libggml-vulkan.so "$st/llama/"
  [ -f .deps/llamacpp-cuda/lib/libggml-cuda.so ] && cp -L .deps/llamacpp-cuda/lib/libggml-cuda.so "$st/llama/"
  cp -L "$(ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}')" "$st/lib/" 2>/dev/null || true
  cp ../shared/models/stories260K.gguf "$st/models/" 2>/dev/null || true
  build-device/tapdiff fixture --out "$st/models" --only llama-f32,llama-q8_0,qwen3-q4_k >/dev/null
  mkdir -p out
  tar -C "$st" -cJf "$BUNDLE" .
  rm -rf "$st"
  echo "ci/device-check.sh: $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); carry it: run(carry=[\"$BUNDLE\"], command=\"bash ci/device-check.sh\")"
  exit 0
fi

[ -f "$BUNDLE" ] || { echo "ci/device-check.sh: no $BUNDLE: run ci/device-check.sh --pack on the build machine first" >&2; exit 77; }
D=$ROOT/out/device
rm -rf "$D" && mkdir -p "$D" && tar -C "$D" -xJf "$BUNDLE"
export LD_LIBRARY_PATH="$D/lib:$D/llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TD_LLAMACPP_LIBDIR=$D/llama TD_LLAMACPP_VULKAN_LIB=$D/llama/libggml-vulkan.so
export TD_LLAMACPP_CUDA_LIB=$D/llama/libggml-cuda.so
export XDG_CACHE_HOME=$ROOT/out/cache
# a real GPU first; lavapipe, if installed there, is a CPU-type device
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
T=$D/tapdiff
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$T" backends
arms=()
for arm in llamacpp:vulkan llamacpp:cuda; do
  "$T" backends | awk -v a="$arm" '$1==a && $2=="available"{f=1} END{exit !f}' && arms+=("$arm")
done
[ ${#arms[@]} -gt 0 ] || { echo "ci/device-check.sh: no GPU arm can run here (see above)" >&2; exit 77; }

p1=1 p8=1,2,3,4,5,6,7,8 p40=$(seq -s, 1 40)
status=0
printf '%-16s %-12s %-4s %-34s %-10s %-26s %-8s %-9s %-9s %s\n' arm model T profile verdict "first divergent" "worst r" "vs plain" "cpu vs plain" seconds
for arm in "${arms[@]}"; do
  for m in "$D"/models/*.gguf; do
    for T_ in 1 8 40; do
      eval toks=\$p$T_
      out=$D/run-$(basename "$m" .gguf)-$T_-${arm#llamacpp:}
      s=$(date +%s)
      timeout 120 "$T" bisect --model "$m" --a llamacpp --b "$arm" --tokens "$toks" --steps 16 --threads 4 \
        --out-dir "$out" --quiet --json >"$out.json" 2>"$out.err"
      rc=$?
      python3 - "$out.json" "$arm" "$(basename "$m" .gguf)" "$T_" "$rc" "$(( $(date +%s) - s ))" <<'PY' || status=1
import json, sys
path, arm, model, T, rc, secs = sys.argv[1:]
try:
    j = json.load(open(path)); a, b = j["a"], j["b"]
except Exception:
    print(f"{arm:16s} {model:12s} {T:4s} {'-':34s} {'exit '+rc:10s} (no result)"); sys.exit(1 if T == "1" else 0)
first = f"{b.get('first_tap','-')}@{b.get('first_step','-')}" if b["verdict"] != "conformant" else "-"
print(f"{arm:16s} {model:12s} {T:4s} {b['profile']:34s} {b['verdict']:10s} {first:26s} {b['worst_ratio']:<8.3g} "
      f"{b['logits_vs_plain_oracle']:<9.2e} {a['logits_vs_plain_oracle']:<9.2e} {secs}")
sys.exit(1 if T == "1" and b["verdict"] != "conformant" else 0)
PY
    done
  done
done
exit $status
