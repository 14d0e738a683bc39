#!/usr/bin/python3
"""Mutation test of every verb that reads tap files (README "Exit codes").

Seeds come from tapdiff itself at test time: a qwen3moe fixture, a full-tap
run of the reference, a ref32 run, and a golden. From them it derives N
mutants (byte flips, truncations, attribute corruption, wrong types and
shapes, NaN/Inf, reordered / duplicated / missing steps, golden calibrations
out of range) and runs the reading verbs on each:
  tap-file mutants: compare M SEED, audit M, run --decode pinned:M (a share)
  golden mutants:   gate --golden M, compare M SEED
  fuzz/regress/tapfile/* (past fuzzing findings): all four verbs
Verdict (the exit status): every run ends with a documented exit code
(0, 1, 3; gate also 125), none dies by a signal, none runs past the hang
limit, and no sanitizer report appears on stderr.

usage: mutate_taps.py TAPDIFF [N_MUTANTS] [JOBS] [STRIDE]

Mutant i is made from its own seed (TD_MUTATE_SEED, i), so STRIDE k runs
mutants 0, k, 2k, ... of the N: the same files the full run makes, a
deterministic subset of every mutation kind (the sanitizer build runs one
third: meson.build).
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

HANG_S = 300
ALLOWED = {"compare": {0, 1, 3}, "audit": {0, 1, 3}, "pinned": {0, 3}, "gate": {0, 1, 3, 125}}
SANITIZER = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer", "runtime error:")
TOKENS = "1,15,20,7"
STEPS = "3"


def sh(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600, **kw)


def seed(td, d):
    fx = os.path.join(d, "fx")
    model = os.path.join(fx, "qwen3moe-q8_0.gguf")
    for argv in (
        [td, "fixture", "--out", fx, "--only", "qwen3moe-q8_0"],
        [td, "run", "--model", model, "--backend", "ref", "--tokens", TOKENS, "--steps", STEPS,
         "--out", os.path.join(d, "ref.h5")],
        [td, "run", "--model", model, "--backend", "ref32", "--tokens", TOKENS, "--steps", STEPS,
         "--out", os.path.join(d, "ref32.h5")],
        [td, "golden", "--model", model, "--tokens", TOKENS, "--steps", STEPS, "--out",
         os.path.join(d, "golden.h5")],
    ):
        r = sh(argv)
        if r.returncode != 0:
            sys.exit("seed command failed (%d): %s\n%s" % (r.returncode, " ".join(argv), r.stderr.decode()))
    return model


# ------------------------------------------------------------ mutations

def m_flip(rng, src, dst):
    b = bytearray(open(src, "rb").read())
    # Most of a tap file is raw data; half the flips land in the first
    # 64 KiB, where the superblock, object headers and heaps are.
    for _ in range(rng.randint(1, 8)):
        lim = len(b) if rng.random() < 0.5 else min(len(b), 65536)
        i = rng.randrange(lim)
        b[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    open(dst, "wb").write(b)


def m_heap(rng, src, dst):
    # Variable-length strings live in global heap collections ("GCOL"): an
    # object's stored size or a collection's length corrupted.
    b = bytearray(open(src, "rb").read())
    offs = [i for i in range(len(b)) if b.startswith(b"GCOL", i)] if len(b) < (8 << 20) else []
    if not offs:
        return m_flip(rng, src, dst)
    o = rng.choice(offs)
    i = o + rng.randrange(8, 64)
    if i < len(b):
        b[i] = rng.choice([0, 0xFF, b[i] ^ 0x80, b[i] + 1 & 0xFF, 0x7F])
    open(dst, "wb").write(b)


def m_trunc(rng, src, dst):
    b = open(src, "rb").read()
    open(dst, "wb").write(b[: rng.randrange(len(b))])


def steps_of(f):
    return sorted(f["steps"].keys())


def pick_tap(rng, f):
    s = rng.choice(steps_of(f))
    names = list(f["steps"][s].keys())
    return f["steps"][s], rng.choice(names)


BAD_VALUES = [
    -1, 0, 2, 2**62, -(2**62), 1e308, float("nan"), float("inf"), -float("inf"), "text", "",
    np.array([1, 2, 3], dtype=np.int64), np.array([-5], dtype=np.int64), np.int8(7), np.float32(1.5),
    np.array([2**40, 2**40], dtype=np.int64), np.uint64(2**64 - 1),
]


def m_attr(rng, src, dst):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        where = rng.random()
        if where < 0.25:
            obj = f
        elif where < 0.5:
            obj = f["steps"][rng.choice(steps_of(f))]
        else:
            g, name = pick_tap(rng, f)
            obj = g[name]
        keys = list(obj.attrs.keys())
        if not keys:
            return
        k = rng.choice(keys)
        if rng.random() < 0.15:
            del obj.attrs[k]
        else:
            v = rng.choice(BAD_VALUES)
            obj.attrs[k] = v


def m_dataset(rng, src, dst):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        g, name = pick_tap(rng, f)
        d = g[name]
        attrs = dict(d.attrs)
        kind = rng.randrange(4)
        if d.shape is None or kind == 0:  # wrong storage type
            data = np.zeros((2, 3), dtype=rng.choice([np.int8, np.float32, np.float64, np.int64, np.uint16]))
        elif kind == 1:  # wrong shape
            data = np.zeros(tuple(max(1, x + rng.choice([-1, 1])) for x in d.shape), dtype=d.dtype)
        elif kind == 2:  # non-finite values
            data = d[()].copy()
            if data.dtype.kind == "f" and data.size:
                idx = rng.randrange(data.size)
                data.flat[idx] = rng.choice([np.nan, np.inf, -np.inf])
                if rng.random() < 0.3:
                    data[...] = np.nan
            else:
                data.flat[rng.randrange(data.size)] = rng.choice([-1, 2**31 - 1, 999999]) if data.size else 0
        else:  # a scalar or 3-D dataset
            data = np.zeros((1, 1, 1), dtype=d.dtype) if rng.random() < 0.5 else np.float64(1.0)
        del g[name]
        nd = g.create_dataset(name, data=data)
        for k, v in attrs.items():
            nd.attrs[k] = v


def m_steps(rng, src, dst):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        st = f["steps"]
        names = steps_of(f)
        kind = rng.randrange(5)
        if len(names) < 2:
            kind = 4
        if kind == 0:  # swap two steps
            a, b = rng.sample(names, 2)
            st.move(a, "tmp")
            st.move(b, a)
            st.move("tmp", b)
        elif kind == 1:  # duplicate a step over another
            a, b = rng.sample(names, 2)
            del st[b]
            f.copy(st[a], st, name=b)
        elif kind == 2:  # a step missing in the middle
            del st[rng.choice(names[:-1])]
        elif kind == 3:  # an extra step at the end, a copy of an earlier one
            f.copy(st[rng.choice(names)], st, name="%06d" % len(names))
        else:  # a foreign member
            st.create_dataset("junk", data=np.zeros(3))


def m_golden(rng, src, dst):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        kind = rng.randrange(6)
        if kind == 0:
            f.attrs["calib_logits_rel_l2_max"] = rng.choice([1e308, float("nan"), float("inf"), 0.0, -1e-7, 5.0])
        elif kind == 1:
            f.attrs["calib_logits_rel_l2"] = rng.choice(["nan,nan,nan,nan", "1e308,1,1,1", "-1,0,0,0", "x", ""])
        elif kind == 2:
            k = rng.choice(["golden", "golden_version", "model_sha256", "calib_logits_rel_l2_max",
                            "calib_logits_rel_l2", "fixture"])
            if k in f.attrs:
                del f.attrs[k]
        elif kind == 3:
            f.attrs[rng.choice(["golden", "model_sha256", "golden_version"])] = rng.choice(["x", "0" * 64, "2"])
        else:  # non-finite logits at some step
            s = rng.choice(steps_of(f))
            d = f["steps"][s]["out.logits"]
            v = d[()]
            v.flat[rng.randrange(v.size)] = rng.choice([np.nan, np.inf, -np.inf])
            d[...] = v


TAP_MUTATORS = [(m_flip, 4), (m_heap, 2), (m_trunc, 1), (m_attr, 4), (m_dataset, 2), (m_steps, 2)]
GOLDEN_MUTATORS = [(m_golden, 4), (m_flip, 2), (m_heap, 1), (m_attr, 2), (m_steps, 1)]


def choose(rng, table):
    total = sum(w for _, w in table)
    x = rng.uniform(0, total)
    for fn, w in table:
        x -= w
        if x <= 0:
            return fn
    return table[-1][0]


# ------------------------------------------------------------ runs

def run_one(job):
    verb, argv = job
    try:
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        return verb, argv, "hang", "no exit after %d s" % HANG_S
    err = r.stderr.decode(errors="replace")
    if r.returncode < 0:
        return verb, argv, "signal %d" % -r.returncode, err[-2000:]
    if any(s in err for s in SANITIZER):
        return verb, argv, "sanitizer report (exit %d)" % r.returncode, err[-3000:]
    if r.returncode not in ALLOWED[verb]:
        return verb, argv, "exit %d (not documented for %s)" % (r.returncode, verb), err[-1000:]
    return verb, argv, None, r.returncode


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    td = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    jobs_n = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    stride = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    seed0 = int(os.environ.get("TD_MUTATE_SEED", "17"))
    # A file that makes the HDF5 library loop ends the reader's checker after
    # this many CPU seconds (exit 3); honest mutants need well under one.
    os.environ.setdefault("TD_TAPFILE_CHECK_SECONDS", "5")
    d = tempfile.mkdtemp(prefix="td_mutate_")
    try:
        model = seed(td, d)
        ref, ref32, golden = (os.path.join(d, x) for x in ("ref.h5", "ref32.h5", "golden.h5"))
        jobs, kinds = [], {}
        n_golden = n // 4
        made = 0
        for i in range(0, n, stride):
            made += 1
            rng = random.Random(seed0 * 1000003 + i)
            is_golden = i < n_golden
            fn = choose(rng, GOLDEN_MUTATORS if is_golden else TAP_MUTATORS)
            m = os.path.join(d, "m%05d.h5" % i)
            try:
                fn(rng, golden if is_golden else ref, m)
            except Exception as e:  # h5py refused the mutation: fall back to a byte flip
                m_flip(rng, golden if is_golden else ref, m)
                fn = m_flip
                _ = e
            kinds[fn.__name__] = kinds.get(fn.__name__, 0) + 1
            if is_golden:
                jobs.append(("gate", [td, "gate", "--golden", m, "--backend", "ref32", "--model", model]))
                jobs.append(("compare", [td, "compare", m, golden]))
            else:
                jobs.append(("compare", [td, "compare", m, ref32]))
                jobs.append(("audit", [td, "audit", m]))
                if i % 4 == 0:
                    jobs.append(("pinned", [td, "run", "--model", model, "--backend", "ref32", "--tokens", TOKENS,
                                            "--steps", STEPS, "--decode", "pinned:" + m, "--taps", "none"]))
        # Files that once were findings (fuzz/regress/tapfile/), every verb.
        regress = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fuzz", "regress", "tapfile")
        for r in sorted(os.listdir(regress)) if os.path.isdir(regress) else []:
            m = os.path.join(regress, r)
            jobs.append(("compare", [td, "compare", m, ref32]))
            jobs.append(("audit", [td, "audit", m]))
            jobs.append(("gate", [td, "gate", "--golden", m, "--backend", "ref32", "--model", model]))
            jobs.append(("pinned", [td, "run", "--model", model, "--backend", "ref32", "--tokens", TOKENS,
                                    "--steps", STEPS, "--decode", "pinned:" + m, "--taps", "none"]))
            kinds["regress"] = kinds.get("regress", 0) + 1
        bad, codes = [], {}
        with ThreadPoolExecutor(max_workers=jobs_n) as ex:
            for verb, argv, problem, detail in ex.map(run_one, jobs):
                if problem:
                    bad.append((verb, argv, problem, detail))
                else:
                    codes[(verb, detail)] = codes.get((verb, detail), 0) + 1
        print("mutate_taps: %d of %d mutants (%s), %d runs" % (made, n, ", ".join("%s %d" % kv for kv in sorted(kinds.items())),
                                                         len(jobs)))
        print("exit codes: " + ", ".join("%s=%d: %d" % (v, c, k) for (v, c), k in sorted(codes.items())))
        for verb, argv, problem, detail in bad[:20]:
            print("FAIL %s: %s\n  %s\n  %s" % (verb, problem, " ".join(argv), str(detail).strip().replace("\n", "\n  ")))
        print("failures: %d" % len(bad))
        if bad:
            keep = os.environ.get("TD_MUTATE_KEEP")
            if keep:
                os.makedirs(keep, exist_ok=True)
                for _, argv, _, _ in bad:
                    for a in argv:
                        if a.startswith(d) and os.path.basename(a).startswith("m"):
                            shutil.copy(a, keep)
                        elif a.startswith("pinned:" + d):
                            shutil.copy(a[7:], keep)
            return 1
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
