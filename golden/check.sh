#!/bin/sh
# golden/check.sh TAPDIFF: the golden files still hold (meson suite
# 'golden'). For every entry of golden/MANIFEST:
#   1. the fixture regenerates to the sha256 the MANIFEST recorded;
#   2. `tapdiff gate` of ref and of ref32 against the checked-in golden: 0;
#   3. regenerating the golden with the MANIFEST's command gives the same
#      verdicts: gate of ref and ref32 against the regenerated golden: 0, and
#      `tapdiff compare` of the checked-in golden against it: conformant.
# Exit 0 all hold, 1 something does not (each failure printed), 77 skipped
# when this build cannot write fixtures or run the reference.
set -u
T=${1:-${TD_TAPDIFF:-}}
[ -n "$T" ] || { echo "usage: golden/check.sh path/to/tapdiff"; exit 2; }
G=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp" # gate's fixture cache and temporary files go here too
FIXTURES=$tmp/fx
GOLDEN=$tmp/regen
mkdir -p "$FIXTURES" "$GOLDEN"
if ! "$T" fixture --out "$FIXTURES" --only llama-q8_0 > "$tmp/log" 2>&1; then
    echo "SKIP: tapdiff fixture does not work in this build:"; cat "$tmp/log"; exit 77
fi
if ! "$T" run --model "$FIXTURES/llama-q8_0.gguf" --backend ref --tokens 1 --steps 1 --quiet > "$tmp/log" 2>&1; then
    echo "SKIP: the ref backend does not run in this build:"; cat "$tmp/log"; exit 77
fi
fail=0
n=0
expect() { # expect RC DESCRIPTION COMMAND...
    want=$1; what=$2; shift 2
    "$@" > "$tmp/out" 2>&1
    got=$?
    if [ "$got" -ne "$want" ]; then
        echo "FAIL: $what: exit $got, expected $want"; sed 's/^/    /' "$tmp/out"; fail=1
    else
        echo "ok: $what"
    fi
}
while IFS='	' read -r file fixture sha rev cmd; do
    case "$file" in '#'*|'') continue ;; esac
    n=$((n + 1))
    "$T" fixture --out "$FIXTURES" --only "$fixture" > /dev/null 2>&1
    got=$(sha256sum "$FIXTURES/$fixture.gguf" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
        echo "FAIL: fixture $fixture regenerates to sha256 $got, MANIFEST says $sha (made at $rev):"
        echo "      the fixture writer changed; regenerate the goldens on purpose (golden/regen.sh)"
        fail=1
        continue
    fi
    for b in ref ref32; do
        expect 0 "gate $b against golden/$file" "$T" gate --golden "$G/$file" --backend "$b" --model "$FIXTURES/$fixture.gguf" --quiet
    done
    # the MANIFEST's command, with this build's tapdiff and the temporary directories
    eval "set -- $(printf '%s' "$cmd" | sed -e 's/^tapdiff //' -e "s|out/fixtures/|$FIXTURES/|" -e "s|--out golden/|--out $GOLDEN/|")"
    expect 0 "regenerate golden/$file" "$T" "$@" --quiet
    for b in ref ref32; do
        expect 0 "gate $b against the regenerated $file" "$T" gate --golden "$GOLDEN/$file" --backend "$b" --quiet
    done
    expect 0 "compare golden/$file with its regeneration" "$T" compare "$G/$file" "$GOLDEN/$file"
done < "$G/MANIFEST"
if [ "$n" -eq 0 ]; then echo "FAIL: golden/MANIFEST lists no golden"; exit 1; fi
exit $fail
