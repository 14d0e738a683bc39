#!/bin/sh
# golden/regen.sh TAPDIFF: regenerates the golden files and golden/MANIFEST.
# Run only on purpose (a deliberate change of the reference or the fixtures),
# then commit the .h5 files with the MANIFEST. Each golden is the ref arm on a
# fixture model (regenerated bit for bit by `tapdiff fixture`, so the golden
# stores the fixture name and sha256, not the model): a 4-token prompt and 6
# greedy decode steps, logits only, plus the ref32-vs-ref calibration.
set -eu
T=${1:?usage: golden/regen.sh path/to/tapdiff}
T=$(cd "$(dirname "$T")" && pwd)/$(basename "$T")
G=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# Relative paths, so the goldens' provenance (model, command_line) reads as
# the MANIFEST does: out/fixtures is where ci/demo.sh writes the fixtures.
cd "$W"
FIXTURES=out/fixtures
REV=$("$T" --version | sed 's/.*(\(.*\)).*/\1/')
TOKENS=1,15,20,7
STEPS=6
{
    printf '# tapdiff golden files (regenerate only on purpose: golden/regen.sh TAPDIFF)\n'
    printf '# columns, tab-separated: file, fixture, fixture sha256, tapdiff revision, command\n'
    printf '# (out/fixtures = `tapdiff fixture --out out/fixtures`; run from the repository root)\n'
} > "$G/MANIFEST"
for fx in llama-q8_0 qwen3-q4_k qwen3moe-q8_0; do
    "$T" fixture --out "$FIXTURES" --only "$fx" > /dev/null
    sha=$(sha256sum "$FIXTURES/$fx.gguf" | cut -d' ' -f1)
    cmd="tapdiff golden --model $FIXTURES/$fx.gguf --tokens $TOKENS --steps $STEPS --logits-only --out golden/$fx.h5"
    mkdir -p golden
    "$T" golden --model "$FIXTURES/$fx.gguf" --tokens $TOKENS --steps $STEPS --logits-only --out "golden/$fx.h5"
    mv "golden/$fx.h5" "$G/$fx.h5"
    printf '%s\t%s\t%s\t%s\t%s\n' "$fx.h5" "$fx" "$sha" "$REV" "$cmd" >> "$G/MANIFEST"
done
echo "wrote $G/MANIFEST"
