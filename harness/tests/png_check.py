#!/usr/bin/env python3
"""Checks that a PNG screenshot is not blank: decodes it with the standard
library only (zlib + the PNG filters) and requires several distinct colours,
a non-trivial share of non-background pixels and some pixel variance.
Usage: png_check.py FILE.png   -> exit 0 not blank, 1 blank, 2 not a PNG.
Used by harness/tests/test_report.c on Chromium's --screenshot output."""
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("unsupported PNG: depth %d colour type %d interlace %d" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        f = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def main():
    try:
        w, h, bpp, rows = decode(sys.argv[1])
    except Exception as e:  # noqa: BLE001 - any decoding failure means "not a PNG we can judge"
        print("png_check: %s: %s" % (sys.argv[1], e))
        return 2
    colours, n, s, s2 = {}, 0, 0.0, 0.0
    for r in rows[::2]:
        for x in range(0, w * bpp, bpp * 2):
            px = r[x:x + 3]
            colours[px] = colours.get(px, 0) + 1
            g = sum(px) / 3.0
            n += 1
            s += g
            s2 += g * g
    mean = s / n
    var = s2 / n - mean * mean
    background = max(colours.values()) / n
    print("png_check: %dx%d, %d colours, background %.1f%%, grey variance %.1f"
          % (w, h, len(colours), 100 * background, var))
    return 0 if len(colours) >= 8 and background < 0.995 and var > 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
