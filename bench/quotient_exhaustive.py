"""kernels/common.py _reciprocal and _quotient, mirrored in numpy with the interpreter's own
single-rounding fma (the GPU's FFMA), against numpy's correctly rounded division.

--reciprocal: y = fl(1 / d) for every significand of d at eight exponents (the all-ones one
taken from the exponent, as the kernel does). Default: fl(x / d) for every fp32 dividend x
and a few divisors d, the mismatches counted by |x| (the kernel's x is exact from 2^-102 up,
where the remainder cannot underflow) and overflow.

    python bench/quotient_exhaustive.py --reciprocal
    python bench/quotient_exhaustive.py --divisors 0.7,1.9999999 [--step 24]
"""
import argparse
import time

import numpy as np
from triton._C.libtriton import interpreter as _interpreter

fma = _interpreter.fma_fp32


def reciprocal(d):
    """_reciprocal on a numpy fp32 array of positive normal d."""
    b = d.view(np.int32)
    y = (np.int32(0x7EF311C3) - b).view(np.float32)
    one = np.ones_like(d)
    for _ in range(4):
        y = fma(fma(-d, y, one), y, y)
    yo = ((b & np.int32(-2147483648)) | ((253 - ((b >> 23) & 255)) << 23) | 1).astype(
        np.int32).view(np.float32)
    return np.where((b & 0x7FFFFF) == 0x7FFFFF, yo, y)


def quotient(x, d):
    """_quotient's operations on numpy fp32 x (d a scalar, not 1)."""
    dd = np.full_like(x, d)
    y = np.full_like(x, reciprocal(np.array([d], np.float32))[0])
    q = (x * y).astype(np.float32)
    c = fma(fma(-q, dd, x), y, q)
    return np.where(c == c, c, q)


def check_reciprocal():
    for e in (1, 60, 100, 126, 127, 150, 200, 252):
        d = ((np.uint32(e) << 23) | np.arange(1 << 23, dtype=np.uint32)).view(np.float32)
        wrong = reciprocal(d).view(np.uint32) != (np.float32(1.0) / d).view(np.uint32)
        print(f"exponent {e - 127:+d}: {int(wrong.sum())} of 2^23 significands differ",
              flush=True)


def check_quotient(divisors, step):
    for d in divisors:
        t0, bad = time.time(), {"|x| >= 2^-102": 0, "|x| < 2^-102": 0, "overflow": 0}
        for lo in range(0, 1 << 32, 1 << step):
            x = np.arange(lo, lo + (1 << step), dtype=np.uint64).astype(np.uint32).view(
                np.float32)
            got, want = quotient(x, d), x / d
            diff = (got != want) & ~(np.isnan(got) & np.isnan(want))  # -0 == +0
            w = np.abs(want[diff])
            ax = np.abs(x[diff])
            bad["overflow"] += int((w == np.inf).sum())
            bad["|x| < 2^-102"] += int((ax < 2.0 ** -102).sum())
            bad["|x| >= 2^-102"] += int(((ax >= 2.0 ** -102) & (w < np.inf)).sum())
        print(f"d = {float(d)!r} ({int(d.view(np.uint32)):#010x}): mismatches {bad} of 2^32 "
              f"dividends, {time.time() - t0:.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reciprocal", action="store_true")
    ap.add_argument("--divisors", default="0.7,1.9999999,0.6,1.05")
    ap.add_argument("--step", type=int, default=24, help="log2 of a chunk of dividends")
    a = ap.parse_args()
    with np.errstate(all="ignore"):
        if a.reciprocal:
            check_reciprocal()
        else:
            check_quotient([np.float32(float(s)) for s in a.divisors.split(",")], a.step)


if __name__ == "__main__":
    main()
