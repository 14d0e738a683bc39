#!/usr/bin/env bash
# Fetches llama.cpp's prebuilt shared libraries and the matching headers into
# .deps/llamacpp/ (ignored by git) for the optional llamacpp peer backend.
# Nothing of llama.cpp is ever committed: the build finds it here or skips
# the peer. Idempotent and quiet; on any failure (no npm, no network) it
# prints one line and exits 0 so the rest of the build still succeeds.
#
#   .deps/llamacpp/lib/          libllama.v0.5.0.so, libggml*.so, libggml-cpu-<variant>.so
#   .deps/llamacpp/include/      llama.h and ggml's public headers
#   .deps/llamacpp/VERSION       what was fetched (the build's provenance)
#
# GPU arms of the same adapter, each into its own folder so that a refetch of
# the CPU set never removes them (and they never touch the CPU set other
# builds link against):
#   .deps/llamacpp-vulkan/lib/   libggml-vulkan.so (loaded at run time by the
#                                CPU package's libggml; fetched by default)
#   .deps/llamacpp-cuda/lib/     libggml-cuda.so (~180 MB; only with --cuda)
# usage: ci/fetch-llamacpp.sh [--force] [--cuda] [--no-vulkan]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 0

FORCE=0 CUDA=0 VULKAN=1
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    --cuda) CUDA=1 ;;
    --no-vulkan) VULKAN=0 ;;
    *) echo "usage: ci/fetch-llamacpp.sh [--force] [--cuda] [--no-vulkan]" >&2; exit 2 ;;
  esac
done

VERSION=3.22.1
BIN_PKG=@node-llama-cpp/linux-x64@$VERSION
SRC_PKG=node-llama-cpp@$VERSION
DEST=.deps/llamacpp
STAMP=$DEST/VERSION
WANT="node-llama-cpp $VERSION linux-x64"

skip() { echo "ci/fetch-llamacpp.sh: llama.cpp peer not fetched ($*); the build continues without it" >&2; exit 0; }

# One GPU package: its backend library (nothing else: the CPU set above is
# byte-identical in both packages) into .deps/llamacpp-KIND/lib.
# Failures print one line and leave the CPU set as it is.
fetch_gpu() { # kind lib
  local kind=$1 lib=$2 pkg=@node-llama-cpp/linux-x64-$1@$VERSION dest=.deps/llamacpp-$1 w tgz
  local want="node-llama-cpp $VERSION linux-x64-$kind"
  if [ $FORCE = 0 ] && [ -f "$dest/VERSION" ] && [ "$(head -1 "$dest/VERSION")" = "$want" ] && [ -f "$dest/lib/$lib" ]; then
    return 0
  fi
  w=$(mktemp -d .deps/llamacpp-$kind-fetch.XXXXXX) || { echo "ci/fetch-llamacpp.sh: $kind arm not fetched (cannot create a temporary folder)" >&2; return 0; }
  if ! ( cd "$w" && timeout 900 npm pack --loglevel=error --fetch-retries=1 "$pkg" >/dev/null 2>npm.log ); then
    echo "ci/fetch-llamacpp.sh: $kind arm not fetched (npm pack $pkg failed); the build continues without it" >&2
    rm -rf "$w"; return 0
  fi
  tgz=$(ls "$w"/node-llama-cpp-linux-x64-$kind-"$VERSION".tgz 2>/dev/null)
  mkdir -p "$w/out/lib"
  if [ -z "$tgz" ] || ! tar -xzf "$tgz" -C "$w" "package/bins/linux-x64-$kind/$lib" \
     || ! mv "$w/package/bins/linux-x64-$kind/$lib" "$w/out/lib/"; then
    echo "ci/fetch-llamacpp.sh: $kind arm not fetched (no bins/linux-x64-$kind/$lib in $pkg)" >&2
    rm -rf "$w"; return 0
  fi
  printf '%s\n' "$want" >"$w/out/VERSION"
  rm -rf "$dest" && mv "$w/out" "$dest" && echo "ci/fetch-llamacpp.sh: $kind arm ($lib) in $dest" >&2
  rm -rf "$w"
}

if [ $FORCE = 0 ] && [ -f "$STAMP" ] && [ "$(head -1 "$STAMP")" = "$WANT" ] \
   && [ -f "$DEST/include/llama.h" ] && [ -f "$DEST/lib/libllama.v0.5.0.so" ]; then
  [ $VULKAN = 1 ] && fetch_gpu vulkan libggml-vulkan.so
  [ $CUDA = 1 ] && fetch_gpu cuda libggml-cuda.so
  exit 0
fi

[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || skip "prebuilt libraries exist here for Linux x86_64 only, this is $(uname -s)-$(uname -m)"
command -v npm >/dev/null 2>&1 || skip "npm not found (Debian package nodejs/npm)"
command -v git >/dev/null 2>&1 || skip "git not found"
command -v tar >/dev/null 2>&1 || skip "tar not found"

mkdir -p .deps || skip "cannot create .deps/"
work=$(mktemp -d .deps/llamacpp-fetch.XXXXXX) || skip "cannot create a temporary folder in .deps/"
trap 'rm -rf "$work"' EXIT

# npm pack downloads the package tarball without installing anything (no
# dependencies, no install scripts).
# (bounded: without a network npm would otherwise retry for minutes)
( cd "$work" && timeout 600 npm pack --loglevel=error --fetch-retries=1 "$BIN_PKG" "$SRC_PKG" >/dev/null 2>npm.log ) \
  || skip "npm pack $BIN_PKG $SRC_PKG failed: $(grep -m1 -i 'error' "$work/npm.log" 2>/dev/null | cut -c1-200)"
bin_tgz=$(ls "$work"/node-llama-cpp-linux-x64-"$VERSION".tgz 2>/dev/null) || skip "npm pack gave no $BIN_PKG tarball"
src_tgz=$(ls "$work"/node-llama-cpp-"$VERSION".tgz 2>/dev/null) || skip "npm pack gave no $SRC_PKG tarball"

mkdir -p "$work/bin" "$work/src"
tar -xzf "$bin_tgz" -C "$work/bin" || skip "cannot unpack $bin_tgz"
tar -xzf "$src_tgz" -C "$work/src" package/llama/gitRelease.bundle || skip "no llama/gitRelease.bundle in $SRC_PKG"
libdir=$work/bin/package/bins/linux-x64
[ -f "$libdir/libllama.v0.5.0.so" ] || skip "no bins/linux-x64/libllama.v0.5.0.so in $BIN_PKG"

# The bundle is the llama.cpp source the binaries were built from; only its
# public headers are kept.
git clone --quiet "$work/src/package/llama/gitRelease.bundle" "$work/llama.cpp" >/dev/null 2>&1 \
  || skip "git clone of gitRelease.bundle failed"
[ -f "$work/llama.cpp/include/llama.h" ] || skip "the bundle has no include/llama.h"
rev=$(git -C "$work/llama.cpp" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

new=$work/out
mkdir -p "$new/include" "$new/lib"
cp "$work"/llama.cpp/include/*.h "$new/include/" || skip "cannot copy include/*.h"
cp "$work"/llama.cpp/ggml/include/*.h "$new/include/" || skip "cannot copy ggml/include/*.h"
cp -P "$libdir"/*.so* "$new/lib/" || skip "cannot copy the libraries"
printf '%s\nllama.cpp %s\n' "$WANT" "$rev" >"$new/VERSION"

rm -rf "$DEST"
mv "$new" "$DEST" || skip "cannot move the result to $DEST"
echo "ci/fetch-llamacpp.sh: llama.cpp $rev ($WANT) in $DEST" >&2
[ $VULKAN = 1 ] && fetch_gpu vulkan libggml-vulkan.so
[ $CUDA = 1 ] && fetch_gpu cuda libggml-cuda.so
exit 0
