#!/usr/bin/env bash
# Installs everything tapdiff needs to build and test, from Debian's packages.
# Idempotent: does nothing when every package is already there.
set -euo pipefail

PKGS=(
  build-essential pkg-config meson ninja-build
  libhdf5-dev        # tap files
  libcjson-dev       # JSON output and reports
  libopenblas-dev    # cpu backend prefill GEMM
  libcriterion-dev   # tests
  libssl-dev         # SHA-256 (model provenance; OpenSSL uses the CPU's SHA extensions)
  libpcre2-dev       # tokenizer pre-tokenizer regexes
  python3-h5py python3-numpy   # tests check that h5py reads our tap files
  chromium           # the HTML report test renders the report headless
  libvulkan1 mesa-vulkan-drivers   # the llama.cpp Vulkan arm; lavapipe runs it on the CPU
  clang libclang-rt-14-dev     # libFuzzer targets (fuzz/run.sh, a short run in ci/test.sh)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "ci/setup.sh: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "ci/setup.sh: dependencies present" >&2

# The llama.cpp peer: prebuilt libraries + headers from the npm registry into
# .deps/ (ignored). Optional: without them the peer is not built and its tests
# skip with a message.
bash "$(dirname "$0")/fetch-llamacpp.sh"
