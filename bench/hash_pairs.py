"""Pairwise independence of the draw's token hashes (gpu_sampler/rng.py), the current mix and
the one before the thirty-third session side by side: per seed, 2^16 random row keys x 1024
consecutive ids (2^26 hashes), chi-square p-values of 16 x 16 tables of
  top<d>:  the top 4 bits of h_i against h_(i+d);   low<d>: the low 4 bits, d = 1, 2
  argmax16: which of 16 consecutive ids holds the largest h (equal logits' winner)
  key_lo / key_hi: the same id under keys one random bit apart (either half).
A p-value is uniform on [0, 1] under independence: look for a test that is small on every
seed, not for one small value among the ~56 a run prints.

    python bench/hash_pairs.py --seeds 11:15            # ~3 min on the 2-core machine
    python bench/hash_pairs.py --draws                  # the draws themselves, ~1 min

--draws: 2^20 Gumbel-max draws of a 5-token distribution (0.5, 0.25, 0.15, 0.07, 0.03) through
rng.gumbel_rows, one offset a draw (a decode loop), at ids from 0, 100000 and 131066, seeds 0
and 7: the frequencies' chi-square and that of consecutive draws' pairs against p x p.
"""
import argparse

import numpy as np
from scipy.stats import chi2

from gpu_sampler import rng

U32 = np.uint32


def _fmix32(h):
    h = h ^ (h >> U32(16))
    h = h * U32(0x85EBCA6B)
    h = h ^ (h >> U32(13))
    h = h * U32(0xC2B2AE35)
    return h ^ (h >> U32(16))


def old_hash(k0, k1, ids):
    """The hash of the twenty-sixth to the thirty-second session: one murmur3 finalizer a key half."""
    with np.errstate(over="ignore"):
        return _fmix32(_fmix32(ids.astype(U32) * U32(0x9E3779B1) ^ k0) ^ k1)


def _p(a, b, cells):
    c = np.bincount((a.astype(np.int64) * cells + b).ravel(), minlength=cells * cells)
    e = c.sum() / c.size
    return chi2.sf(((c - e) ** 2 / e).sum(), c.size - 1)


def tests(f, g, R=1 << 16, N=1024):
    k0 = g.integers(0, 2 ** 32, (R, 1), dtype=np.uint64).astype(U32)
    k1 = g.integers(0, 2 ** 32, (R, 1), dtype=np.uint64).astype(U32)
    ids = g.integers(0, 2 ** 17, (R, 1), dtype=np.uint64).astype(U32) + np.arange(N, dtype=U32)
    h = f(k0, k1, ids)
    out = {}
    for d in (1, 2, 3, 4, 7, 8, 16, 64, 256):
        out[f"top{d}"] = _p(h[:, :-d] >> U32(28), h[:, d:] >> U32(28), 16)
    for d in (1, 2):
        out[f"low{d}"] = _p(h[:, :-d] & U32(15), h[:, d:] & U32(15), 16)
    w = h.reshape(R, N // 16, 16).argmax(axis=2).ravel()
    c = np.bincount(w, minlength=16)
    out["argmax16"] = chi2.sf(((c - c.sum() / 16) ** 2 / (c.sum() / 16)).sum(), 15)
    bit = U32(1) << g.integers(0, 32, (R, 1), dtype=np.uint64).astype(U32)
    out["key_lo"] = _p(h >> U32(28), f(k0 ^ bit, k1, ids) >> U32(28), 16)
    out["key_hi"] = _p(h >> U32(28), f(k0, k1 ^ bit, ids) >> U32(28), 16)
    return out


def draws(N=1 << 20):
    import torch
    p = np.array([0.5, 0.25, 0.15, 0.07, 0.03])
    lp = torch.tensor(np.log(p), dtype=torch.float32)
    for base in (0, 100000, 131066):
        for seed in (0, 7):
            ids = (torch.arange(5) + base)[None].expand(N, 5).contiguous()
            g = rng.gumbel_rows(torch.full((N,), seed), torch.arange(N), ids)
            w = (lp[None] + g).argmax(1).numpy()
            c, e = np.bincount(w, minlength=5), N * p
            pair = np.bincount(w[:-1] * 5 + w[1:], minlength=25)
            ep = (N - 1) * np.outer(p, p).ravel()
            print(f"ids {base}.. seed {seed}: draws p={chi2.sf(((c - e) ** 2 / e).sum(), 4):.3f}"
                  f"  consecutive offsets p={chi2.sf(((pair - ep) ** 2 / ep).sum(), 24):.3f}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="11:15", help="first:last (exclusive)")
    ap.add_argument("--draws", action="store_true", help="the draws' frequencies instead")
    args = ap.parse_args()
    if args.draws:
        return draws()
    a, b = map(int, args.seeds.split(":"))
    for s in range(a, b):
        for name, f in (("old", old_hash), ("current", rng.hash_np)):
            out = tests(f, np.random.default_rng(s))
            print(f"seed {s} {name:8s}", " ".join(f"{k}:{v:.3f}" for k, v in out.items()),
                  f"min {min(out.values()):.4f}", flush=True)


if __name__ == "__main__":
    main()
