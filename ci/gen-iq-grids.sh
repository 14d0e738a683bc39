#!/usr/bin/env bash
# Regenerates model/iq_grids.c from the llama.cpp peer in .deps/llamacpp (see
# ci/gen-iq-grids.c for how); prints a diff summary. The build never runs this:
# the data file is committed, and the llamacpp test suite checks every entry.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.deps/llamacpp
[ -f "$root/lib/libggml-base.so" ] || { echo "gen-iq-grids: no $root (run ci/fetch-llamacpp.sh)" >&2; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -std=c17 -O1 -Wall -Wextra -Werror -isystem "$root/include" ci/gen-iq-grids.c -o "$tmp/gen" \
  -L"$root/lib" -l:libggml-base.so -Wl,-rpath,"$PWD/$root/lib"
"$tmp/gen" "$(paste -sd';' "$root/VERSION" | sed 's/;/; /g')" >"$tmp/iq_grids.c"
mv "$tmp/iq_grids.c" model/iq_grids.c
echo "gen-iq-grids: wrote model/iq_grids.c ($(wc -l <model/iq_grids.c) lines)" >&2
