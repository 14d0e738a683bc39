#!/usr/bin/env bash
# Configures and builds one build directory (default: build/, -Wall -Wextra -Werror).
# usage: ci/build.sh [BUILD_DIR] [extra meson options...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" -Dwerror=true "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null
echo "ci/build.sh: built $dir" >&2
