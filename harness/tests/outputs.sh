#!/usr/bin/env bash
# Outputs and write failures (README "Exit codes"): a full disk stops the run
# with exit 4 and one line, and every committed step still reads back with
# tapdiff and h5py; --out naming the model (or a link to it) is refused and
# the model is unchanged; a FIFO as the model is refused at once; --out
# /dev/null means no taps; an unwritable --out is exit 4.
# The disk is a 2 MiB tmpfs when mounting works (root), else the writer's
# test hook TD_TAPS_FAIL_AT_BYTES plays a disk of that size.
# usage: outputs.sh TAPDIFF
set -u
td=$1
d=$(mktemp -d)
small=$d/small
cleanup() { mountpoint -q "$small" 2>/dev/null && umount "$small"; rm -rf "$d"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$td" fixture --out "$d/fx" --only qwen3moe-q8_0 >/dev/null || { echo "fixture failed"; exit 1; }
model=$d/fx/qwen3moe-q8_0.gguf
run() { "$td" run --model "$model" --backend ref --tokens 1,15,20,7 "$@"; }

# ---- disk full
mkdir -p "$small"
hook=()
if mount -t tmpfs -o size=2m tmpfs "$small" 2>/dev/null; then
  echo "disk full: a 2 MiB tmpfs"
else
  echo "disk full: cannot mount a tmpfs here; TD_TAPS_FAIL_AT_BYTES=2097152 plays the disk"
  hook=(env TD_TAPS_FAIL_AT_BYTES=2097152)
fi
${hook[@]+"${hook[@]}"} "$td" run --model "$model" --backend ref --tokens 1,15,20,7 --steps 40 \
  --out "$small/x.h5" >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 4 ] || fail "disk full: exit $rc, expected 4 ($(cat "$d/err"))"
[ "$(wc -l <"$d/err")" -eq 1 ] || fail "disk full: expected one line on stderr, got: $(cat "$d/err")"
grep -q "No space left on device" "$d/err" || fail "disk full: the line does not say why: $(cat "$d/err")"
n=$(/usr/bin/python3 - "$small/x.h5" <<'EOF'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
steps = f["steps"]
assert all(steps[k].attrs["complete"] == 1 for k in steps)
for k in steps:
    for t in steps[k]:
        steps[k][t][()]
print(len(steps))
EOF
) || fail "disk full: h5py cannot read the committed steps"
echo "disk full: $(cat "$d/err"); h5py reads ${n:-?} committed steps"
[ "${n:-0}" -ge 1 ] || fail "disk full: no step was committed before the disk filled (the test needs some)"
"$td" audit "$small/x.h5" >/dev/null 2>"$d/err2" || fail "disk full: tapdiff audit of the committed steps: $(cat "$d/err2")"
"$td" compare "$small/x.h5" "$small/x.h5" >/dev/null 2>"$d/err2" ||
  fail "disk full: tapdiff compare of the committed steps: $(cat "$d/err2")"
ls "$small" | grep -q tmp && fail "disk full: a temporary file was left: $(ls "$small")"

# ---- --out is the model (by name and through a link)
sum=$(sha256sum <"$model")
ln -s "$model" "$d/link.gguf"
for out in "$model" "$d/link.gguf"; do
  run --steps 2 --out "$out" >/dev/null 2>"$d/err"
  rc=$?
  [ $rc -eq 2 ] || fail "--out $out (the model): exit $rc, expected 2: $(cat "$d/err")"
  [ "$(sha256sum <"$model")" = "$sum" ] || fail "--out $out: the model's bytes changed"
done

# ---- --out is the pinned input
run --steps 2 --out "$d/a.h5" >/dev/null 2>&1 || fail "run for the pinned input failed"
cp "$d/a.h5" "$d/a.copy"
"$td" run --model "$model" --backend ref32 --steps 2 --decode "pinned:$d/a.h5" --out "$d/a.h5" >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 2 ] || fail "--out = the pinned input: exit $rc, expected 2: $(cat "$d/err")"
cmp -s "$d/a.h5" "$d/a.copy" || fail "--out = the pinned input: the input changed"

# ---- a FIFO as the model: refused at once, no hang
mkfifo "$d/fifo.gguf"
timeout 10 "$td" run --model "$d/fifo.gguf" --backend ref --tokens 1 --steps 1 --out "$d/f.h5" >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 3 ] || fail "FIFO model: exit $rc, expected 3 (124 = hung): $(cat "$d/err")"

# ---- /dev/null: no taps, no crash; the device is still a device
run --steps 2 --out /dev/null >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 0 ] || fail "--out /dev/null: exit $rc: $(cat "$d/err")"
[ -c /dev/null ] || fail "/dev/null is no longer a character device"

# ---- unwritable output path
run --steps 1 --out "$d/no/such/dir/x.h5" >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 4 ] || fail "unwritable --out: exit $rc, expected 4: $(cat "$d/err")"

# ---- --steps past the model's context
run --steps 100000000 --out "$d/big.h5" >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 2 ] || fail "--steps past the context: exit $rc, expected 2: $(cat "$d/err")"
grep -q "context length" "$d/err" || fail "--steps past the context: $(cat "$d/err")"

# ---- a golden of a model whose weights hold a NaN: refused, nothing written
"$td" fixture --out "$d/fx" --only llama-f32 >/dev/null || fail "fixture llama-f32"
"$td" inspect "$d/fx/llama-f32.gguf" --json --tensors 2>/dev/null | /usr/bin/python3 -c '
import json, struct, sys
d = json.load(sys.stdin)
t = [x for x in d["tensors"] if x["name"] == "output_norm.weight"][0]
b = bytearray(open(sys.argv[1], "rb").read())
o = d["data_start"] + t["offset"]
b[o:o + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)' "$d/fx/llama-f32.gguf" "$d/nan.gguf" || fail "cannot make the NaN model"
"$td" golden --model "$d/nan.gguf" --tokens 1,15 --steps 2 --out "$d/gnan.h5" >/dev/null 2>"$d/err"
rc=$?
[ $rc -eq 3 ] || fail "golden of a NaN model: exit $rc, expected 3: $(cat "$d/err")"
grep -q "non-finite" "$d/err" || fail "golden of a NaN model: the reason is not the non-finite logits: $(cat "$d/err")"
[ -e "$d/gnan.h5" ] && fail "golden of a NaN model: $d/gnan.h5 was written"

echo "outputs: $fails failure(s)"
[ $fails -eq 0 ]
