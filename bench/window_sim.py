"""Can stage 1's count histograms place top-p's second read? A float64 study, no kernel.

The windowed second read (kernels/README.md, "What remains") needs, before it runs, a band
[LO, HI) of x that holds tau_p and at most the list's capacity (NT * KT = 8064 tokens at
V = 128256). Stage 1 can count tokens per bin cheaply (tl.histogram); it cannot sum masses per
bin. This script bins every 1024-token block the way stage 1 would (an absolute grid of width
w: bin floor(m_t / w) - floor(x / w), NB bins, the last one open below), shifts the blocks
onto the row's grid exactly, and reports, per row kind and setting:

    proven   the narrowest band that count bounds *prove* holds tau (each bin's mass between
             count e^(lo - M) and count e^(hi - M); W(t) bounded from the top and from the
             bottom, the tighter kept) and how many tokens it holds
    estimate the error, in tokens, of the nucleus size estimated with each bin's mass taken
             as count e^lo (e^w - 1) / w (a uniform density inside the bin)
    depth    how far below a block's max tau can lie: max over blocks of m_t - tau (the range
             a block's bins must cover for tau not to fall in its open last bin)

    python bench/window_sim.py                 # bench/rows.py's kinds, V = 128256
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rows import KINDS, row_logits  # noqa: E402

V, TILE = 128256, 1024
SETTINGS = [(0.6, 0.9), (1.0, 0.95), (1.0, 0.8), (1.0, 0.99), (0.7, 0.5), (1.2, 0.9)]


def row_bins(x, inv_w, NB):
    """Counts on the row's grid: bin J holds x in [(F - J) w, (F - J + 1) w), F = floor(M / w);
    a block's open last bin is counted at its upper edge (``open_`` marks them)."""
    FM = math.floor(x.max().item() * inv_w)
    NJ = NB + 48 * inv_w
    cnt, open_ = torch.zeros(NJ, dtype=torch.float64), torch.zeros(NJ, dtype=torch.float64)
    for t in range(math.ceil(V / TILE)):
        xb = x[t * TILE:(t + 1) * TILE]
        Ft = math.floor(xb.max().item() * inv_w)
        j = (Ft - torch.floor(xb * inv_w)).long().clamp(max=NB - 1)
        h = torch.bincount(j, minlength=NB).double()
        s = FM - Ft
        cnt[s:s + NB - 1] += h[:NB - 1]
        open_[s + NB - 1] += h[NB - 1]
    lo = torch.tensor([(FM - J) / inv_w for J in range(NJ)], dtype=torch.float64)
    return cnt, open_, lo


def nucleus(x, p):
    xs, _ = torch.sort(x, descending=True)
    cm = torch.cumsum(torch.exp(xs - xs[0]), 0)
    k = int((cm < p * cm[-1]).sum()) + 1
    return k, xs[k - 1].item()


def proven_band(x, p, inv_w, NB):
    """Tokens in the narrowest band [LO, HI) the count bounds prove contains tau_p."""
    M = x.max().item()
    Z = torch.exp(x - M).sum().item()
    cnt, open_, lo = row_bins(x, inv_w, NB)
    w = 1.0 / inv_w
    m_lo = cnt * torch.exp(lo - M)
    m_hi = (cnt + open_) * torch.exp((lo + w).clamp(max=M) - M)
    above_hi = torch.cumsum(m_hi, 0) - m_hi              # upper bound of W(lo_J + w)
    below_hi = m_hi.flip(0).cumsum(0).flip(0) - m_hi + torch.cumsum(open_ * torch.exp(
        (lo + w).clamp(max=M) - M), 0)                   # upper bound of mass below lo_J
    w_lo = torch.maximum(torch.cumsum(m_lo, 0), Z - below_hi)   # lower bound of W(lo_J)
    ok = (w_lo >= p * Z).nonzero()
    LO = lo[ok[0].item()].item() if len(ok) else -math.inf
    bad = (above_hi < p * Z).nonzero()
    HI = lo[bad[-1].item()].item() + w if len(bad) else math.inf
    return int(((x >= LO) & (x < HI)).sum())


def estimate_error(x, p, inv_w, NB):
    """Estimated nucleus size minus the true one (tokens)."""
    M = x.max().item()
    Z = torch.exp(x - M).sum().item()
    cnt, open_, lo = row_bins(x, inv_w, NB)
    cnt = cnt + open_
    w = 1.0 / inv_w
    mass = cnt * torch.exp(lo - M) * (math.exp(w) - 1) / w
    below = mass.flip(0).cumsum(0).flip(0) - mass
    J = int(((Z - below) >= p * Z).nonzero()[0])
    need = p * Z - (Z - below[J] - mass[J])
    frac = min(max(need / mass[J].item(), 0.0), 1.0)
    return cnt[:J].sum().item() + frac * cnt[J].item() - nucleus(x, p)[0]


def depth(x, p):
    """max over blocks of (block max - tau_p), in units of x."""
    tau = nucleus(x, p)[1]
    return max(x[t * TILE:(t + 1) * TILE].max().item() for t in range(math.ceil(V / TILE))) - tau


def main():
    print("| kind | T | p | nucleus | proven band w=1/8 (NB 128) | w=1/16 (NB 256) "
          "| estimate error w=1/8 | w=1/4 (NB 64) | depth |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in KINDS:
        base = row_logits(kind, 1, V)[0].double()
        for T, p in SETTINGS:
            x = base / T
            k = nucleus(x, p)[0]
            b8, b16 = proven_band(x, p, 8, 128), proven_band(x, p, 16, 256)
            e8, e4 = estimate_error(x, p, 8, 128), estimate_error(x, p, 4, 64)
            print(f"| {kind} | {T} | {p} | {k} | {b8} | {b16} | {e8:+.0f} | {e4:+.0f} "
                  f"| {depth(x, p):.1f} |")


if __name__ == "__main__":
    main()
