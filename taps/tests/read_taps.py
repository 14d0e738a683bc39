#!/usr/bin/python3
"""Reads a tapdiff tap file with h5py alone (no tapdiff code) and prints it as
lines that taps/tests/test_taps.c compares with the C reader:

  root <key> <python type> <value>
  step <index> kind=.. pos0=.. n_tokens=.. n_taps=.. complete=..
  tap <step> <name> seq=.. layer=.. dtype=.. shape=a,b has_data=.. null=0|1
      gzip=0|1 shuffle=0|1 fp_count=.. ... fp_first=h,h,h,h   (one line)
  val <step> <name> <float.hex> ...

Floats are printed with float.hex() so the comparison is exact. f16/bf16 taps
are decoded the way the README tells users to: .view(numpy.float16), and
(u16.astype(uint32) << 16).view(float32).
Usage: /usr/bin/python3 read_taps.py FILE
"""
import sys

import h5py
import numpy as np


def as_float_list(ds, dtype):
    raw = np.asarray(ds[()])
    if dtype == "f16":
        vals = raw.astype(np.uint16).view(np.float16).astype(np.float64)
    elif dtype == "bf16":
        vals = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        vals = raw.astype(np.float64)
    return [float(v).hex() for v in vals.reshape(-1)]


def main(path):
    with h5py.File(path, "r") as f:
        for key in sorted(f.attrs.keys()):
            v = f.attrs[key]
            if isinstance(v, np.generic):
                v = v.item()
            print("root", key, type(v).__name__, v)
        for sname in sorted(f["steps"].keys()):
            g = f["steps"][sname]
            a = g.attrs
            print("step", int(sname), "kind=%s pos0=%d n_tokens=%d n_taps=%d complete=%d"
                  % (a["kind"], a["pos0"], a["n_tokens"], a["n_taps"], a["complete"]))
            taps = sorted(g.keys(), key=lambda n: int(g[n].attrs["seq"]))
            for name in taps:
                ds = g[name]
                a = ds.attrs
                fields = [
                    "seq=%d" % a["seq"], "layer=%d" % a["layer"], "dtype=%s" % a["dtype"],
                    "shape=%s" % ",".join(str(int(x)) for x in a["shape"]),
                    "has_data=%d" % a["has_data"], "null=%d" % (ds.shape is None),
                    "gzip=%d" % (ds.compression == "gzip"), "shuffle=%d" % bool(ds.shuffle),
                ]
                for k in ("fp_count", "fp_nonfinite", "fp_nonzero"):
                    fields.append("%s=%d" % (k, a[k]))
                for k in ("fp_min", "fp_max", "fp_maxabs", "fp_sum", "fp_sumabs", "fp_sumsq"):
                    fields.append("%s=%s" % (k, float(a[k]).hex()))
                fields.append("fp_first=" + ",".join(float(x).hex() for x in a["fp_first"]))
                print("tap", int(sname), name, " ".join(fields))
                if a["has_data"]:
                    print("val", int(sname), name, " ".join(as_float_list(ds, a["dtype"])))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: read_taps.py FILE")
    main(sys.argv[1])
