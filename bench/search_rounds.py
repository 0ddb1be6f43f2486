"""Replay of _threshold_search in numpy: how many passes the top-k / top-p searches take.

    .venv/bin/python bench/search_rounds.py
Same pivots, same updates as kernels/sampling.py (16 pivots: 8 in value, 8 in fp32 key space).
"""
import numpy as np
def key(f): b = np.float32(f).view(np.int32).astype(np.int64); return b ^ ((b >> 31) & 0x7FFFFFFF) if b < 0 else b
def unkey(k): k = np.int64(k); b = k ^ ((k >> 31) & 0x7FFFFFFF) if k < 0 else k; return np.int32(b).view(np.float32)
def search(x, M, lo, pv, target, use_count, H=8):
    rounds = 0; lo_mass = None
    e = np.exp(x - M)
    while lo < pv and rounds < 64:
        klo, kpv = key(lo), key(pv)
        jj = np.arange(1, H+1)
        kp = [unkey(klo + ((kpv - klo) * j + H - 1) // H) for j in jj]
        f = jj / (H+1); vp = np.clip(lo*(1-f) + pv*f, unkey(klo+1), pv)
        piv = np.concatenate([vp, kp]).astype(np.float32)
        ge = x[:, None] >= piv[None, :]
        w = ge.sum(0) if use_count else (ge * e[:, None]).sum(0)
        ok = w >= target
        nxt = np.where(ge, x[:, None], np.inf).min(0); prv = np.where(ge, -np.inf, x[:, None]).max(0)
        if ok.any(): lo = nxt[ok].max(); lo_mass = (ge*e[:,None]).sum(0)[ok].min()
        if (~ok).any(): pv = prv[~ok].min()
        rounds += 1
    return lo, lo_mass, rounds
RNG = np.random.default_rng(0)
for V, k, p in [(32000, 50, 0.9), (128256, 50, 0.9), (151936, 50, 0.9), (128256, 0, 0.9), (128256, 1000, 0.95)]:
    rk, rp = [], []
    for _ in range(5):
        x = (RNG.standard_normal(V).astype(np.float32) * 3 / np.float32(0.7)).astype(np.float32)
        M = x.max(); Z = np.exp(x - M).sum()
        lo, zk = x.min(), Z; r1 = 0
        if k: lo, zk, r1 = search(x, M, x.min(), M, k, True)
        tau, _, r2 = search(x, M, lo, M, p * zk, False)
        rk.append(r1); rp.append(r2)
    print(f"V={V} k={k} p={p}: top-k rounds {rk}, top-p rounds {rp}")
