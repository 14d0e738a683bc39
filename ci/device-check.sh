#!/usr/bin/env bash
# Device check of the GPU arms, one short table each:
#   ci/device-check.sh            llama.cpp's GPU arms (Vulkan; CUDA where its
#                                 library was packed) through the conformance set;
#   ci/device-check.sh --cuda     our own CUDA backend (backends/cuda): a compile
#                                 of its kernels with the device's nvcc, cuda vs
#                                 ref bisect on every fixture, stories260K's 201
#                                 greedy ids against ref's, the cuda fault catalog
#                                 localized, and tapdiff bench cuda vs cpu on the
#                                 ~200M benchmark models (Q4_K, Q8_0, F16) next to
#                                 the GPU's bandwidth bound (H200 4.8 TB/s; set
#                                 TD_GPU_BW_TBS for another GPU). Under 8 minutes.
#   ci/device-check.sh --cuda --dry-run
#                                 here, without a GPU: every step that needs none
#                                 (the bundle, its libraries, the fixtures, ref's
#                                 side, bench of cpu on a tiny model) and each
#                                 cuda step must exit 77; the same table.
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

PACK=0 CUDA=0 DRY=0
for a in "$@"; do
  case $a in
    --pack) PACK=1 ;;
    --cuda) CUDA=1 ;;
    --dry-run) DRY=1 ;;
    *) echo "usage: ci/device-check.sh [--pack] | [--cuda [--dry-run]]" >&2; exit 2 ;;
  esac
done

if [ $PACK = 1 ]; then
  set -e
  [ -f build-device/build.ninja ] || meson setup build-device -Dopenblas=disabled -Dtests=disabled -Dwerror=true >/dev/null
  ninja -C build-device -j2 >/dev/null
  build-device/tapdiff backends | grep -q '^cuda ' || echo "ci/device-check.sh: note: build-device has no cuda backend (no nvcc here?): --cuda will skip" >&2
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
  v=$(TD_LLAMACPP_CPU_VARIANT= build-device/tapdiff backends | awk '$1=="llamacpp"' | grep -o 'ggml-cpu-[a-z0-9_]*' | head -1 | sed 's/ggml-cpu-//')
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
if [ $CUDA = 1 ]; then
  # ---- our own CUDA backend ---------------------------------------------
  # Every step is bounded (timeout) so a hang costs one row, not the session.
  W=$D/cuda && mkdir -p "$W"
  TAB=$W/table.txt && : >"$TAB"
  row() { printf '%-7s %-31s %-12s %s\n' "$@" | tee -a "$TAB"; }
  fail=0
  t0=$(date +%s)
  # the benchmark models take a minute or more each to write: in the background from the start
  size=200m; [ "$DRY" = 1 ] && size=tiny
  mk_pids=()
  for ty in Q4_K Q8_0 F16; do
    M=$W/bench-$ty-$size.gguf
    [ -f "$M" ] || { timeout 300 "$T" bench --make-model "$M" --type $ty --size $size >/dev/null 2>"$W/mk-$ty.err" & mk_pids+=($!); }
  done

  # 1. the kernels compile with this machine's nvcc for its own GPU (the
  #    carried tapdiff has sm_90 + PTX built in; this checks the toolchain)
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if [ -x "$NVCC" ]; then
    arch=native; [ "$DRY" = 1 ] && arch=sm_90
    s=$(date +%s)
    if "$NVCC" -std=c++17 -O3 -arch=$arch -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
        -I"$ROOT/model" -I"$ROOT/taps" -I"$ROOT/backends/cuda" -c "$ROOT/backends/cuda/kernels.cu" \
        -o "$W/kernels.o" 2>"$W/nvcc.err"; then
      row build kernels.cu "ok" "nvcc -arch=$arch, $(( $(date +%s) - s )) s"
    else
      row build kernels.cu "FAILED" "$(head -c 300 "$W/nvcc.err" | tr '\n' ' ')"; fail=1
    fi
  else
    row build kernels.cu "no nvcc" "-"
  fi
  "$T" backends | awk '$1=="cuda"' | sed 's/^/backends: /'
  if [ "$DRY" != 1 ] && ! "$T" backends | awk '$1=="cuda" && $2=="available"{f=1} END{exit !f}'; then
    echo "ci/device-check.sh: the cuda backend cannot run here (see above)" >&2
    for p in "${mk_pids[@]}"; do kill "$p" 2>/dev/null; done
    exit 77
  fi

  # 2. cuda vs ref on every fixture (8-token prompt, 16 greedy steps)
  "$T" fixture --out "$W/fx" >/dev/null || { echo "fixture generation failed" >&2; exit 99; }
  for m in "$W"/fx/*.gguf; do
    n=$(basename "$m" .gguf)
    timeout 60 "$T" bisect --model "$m" --a ref --b cuda --tokens 1,17,42,99,7,250,31,64 --steps 16 --quiet --json \
      --out-dir "$W/b-$n" >"$W/b-$n.json" 2>"$W/b-$n.err"
    rc=$?
    v=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); fd=j.get("first_divergent") or {}; print(j["verdict"], (fd.get("name","-")+"@"+str(fd.get("step","-"))) if fd else "-")' "$W/b-$n.json" 2>/dev/null || echo "exit-$rc -")
    row bisect "$n" "${v%% *}" "${v#* } (exit $rc)"
    if [ "$DRY" = 1 ]; then [ $rc = 77 ] || fail=1; else [ $rc = 0 ] || fail=1; fi
  done

  # 3. stories260K: the 201 greedy ids (prefill argmax + 200 steps) equal ref's
  S=$D/models/stories260K.gguf
  if [ -f "$S" ]; then
    timeout 120 "$T" run --model "$S" --backend ref --tokens 1 --steps 200 --taps none 2>/dev/null | grep '^sampled:' >"$W/s-ref.txt"
    timeout 120 "$T" run --model "$S" --backend cuda --tokens 1 --steps 200 --taps none 2>"$W/s-cuda.err" | grep '^sampled:' >"$W/s-cuda.txt"
    rc=${PIPESTATUS[0]}
    nref=$(wc -w <"$W/s-ref.txt"); nref=$((nref - 1))
    if [ "$DRY" = 1 ]; then
      row greedy stories260K "ref $nref ids" "cuda exit $rc (want 77)"; [ "$rc" = 77 ] && [ "$nref" = 201 ] || fail=1
    elif cmp -s "$W/s-ref.txt" "$W/s-cuda.txt" && [ "$nref" = 201 ]; then
      row greedy stories260K "equal" "$nref ids"
    else
      row greedy stories260K "DIFFERENT" "ref $nref ids; cuda exit $rc"; fail=1
    fi
  else
    row greedy stories260K "absent" "-"
  fi

  # 4. the cuda fault catalog: each named at its tap and step
  for spec in stale_token:inp.tokens@2 cuda_sync_missing:blk.0.attn_norm@0 cuda_smem_stride:blk.0.attn_ctx@0; do
    f=${spec%%:*} want=${spec#*:}
    for n in llama-f32 qwen3-f32 qwen3moe-f32; do
      timeout 60 "$T" bisect --model "$W/fx/$n.gguf" --a ref --b cuda --inject "$f" --tokens 1,17,42,99,7,250,31,64 \
        --steps 4 --quiet --json --out-dir "$W/f-$f-$n" >"$W/f-$f-$n.json" 2>"$W/f-$f-$n.err"
      rc=$?
      got=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); fd=j.get("first_divergent") or {}; print(fd.get("name","-")+"@"+str(fd.get("step","-")) if fd else j["verdict"])' "$W/f-$f-$n.json" 2>/dev/null || echo "exit-$rc")
      ok=no; [ "$got" = "$want" ] && ok=yes
      [ "$DRY" = 1 ] && { ok="skip(77)"; [ $rc = 77 ] || { ok=FAILED; fail=1; }; }
      row fault "$f/$n" "$ok" "expected $want, found $got"
      [ "$DRY" != 1 ] && [ $ok != yes ] && fail=1
    done
  done

  # 5. bench: cuda vs cpu on the ~200M models, next to the bandwidth bound
  for p in "${mk_pids[@]}"; do wait "$p"; done
  BW=${TD_GPU_BW_TBS:-4.8}
  printf '%-8s %-6s %12s %12s %14s %14s %10s\n' type arm "prefill t/s" "decode t/s" "MiB/token" "bound t/s" "of bound" | tee -a "$TAB"
  for ty in Q4_K Q8_0 F16; do
    M=$W/bench-$ty-$size.gguf
    for arm in cuda cpu; do
      timeout 120 "$T" bench --model "$M" --backend $arm --prompt-len 128 --gen 32 --repeat 2 --bw-mib 256 --json \
        >"$W/bench-$ty-$arm.json" 2>"$W/bench-$ty-$arm.err"
      rc=$?
      python3 - "$W/bench-$ty-$arm.json" "$ty" "$arm" "$rc" "$BW" <<'PY' | tee -a "$TAB"
import json, sys
path, ty, arm, rc, bw = sys.argv[1:]
try:
    j = json.load(open(path))
except Exception:
    print(f"{ty:8s} {arm:6s} {'exit '+rc:>12s}"); sys.exit(0)
mib = j["decode_weight_mib_per_token"]
# the GPU's bound for cuda (weights read once per token at TD_GPU_BW_TBS), the measured one for cpu
bound = float(bw) * 1e12 / (mib * 1048576) if arm == "cuda" else j["decode_bound_tok_s"]
print(f"{ty:8s} {arm:6s} {j['prefill_tok_s']:12.1f} {j['decode_tok_s']:12.1f} {mib:14.1f} {bound:14.1f} "
      f"{j['decode_tok_s'] / bound:9.1%}")
PY
      if [ "$DRY" = 1 ] && [ $arm = cuda ]; then [ $rc = 77 ] || fail=1; fi
    done
  done
  echo "ci/device-check.sh --cuda: $(( $(date +%s) - t0 )) s, table in $TAB; $([ $fail = 0 ] && echo PASS || echo FAIL)"
  exit $fail
fi
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
