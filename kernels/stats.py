"""Stage 1: one read of the logits. Per statistics block: partial statistics and candidates.

Grid (B, C): program (row, c) owns the blocks [c * TPC, (c + 1) * TPC) of its row, each TILE
tokens wide. Everything it writes is per *block*, never per program, so what lands in the
workspace does not depend on the chunk count C (the merge then reduces blocks in index order).

Per block t, with x = fl(xp / T) (finite = not NaN, not +-inf):
    m_t, z_t      max finite x and sum exp(x - m_t)           (online softmax partials)
    lo_t          min finite x                                 (bracket for the fallback search)
    nfin, n+inf, nnan   counts of x (a pure-temperature row's nfin: 1 if any x is finite)
    candidates    the block's top finite values (xp, and the token id, in one int64 slot), at
                  most KT of them: the values in the widest window {fl(vm - xp) <= D0 2^j}
                  (j < NWIN - 1, D0 = 2^D0_EXP; the last window is every finite value) that
                  holds <= KT values, an upper set (with BANDS the same windows, read off
                  the band estimate's bins: _band_cands). Stored in id order in the block's
                  first ncand slots; the merge masks the rest (never written, never read).
    g_t           max finite x *not* stored (-inf if every finite value is a candidate)

The block works on xp, before the temperature: x = fl(xp / T) is monotone in xp, so its max,
min, windows and candidates are those of x, and no lane divides (m_t, lo_t, g_t are divided
once; the merge divides the candidates it reads). z_t is sum 2^((xp - max xp) log2(e) / T).
Blocks holding a NaN, a +inf or an xp whose x overflows (z_t NaN, m_t = +inf or lo_t = -inf)
redo the block exactly on x; no lane of the common path tests for them. The window of a lane
is read off the exponent of fl(vm - xp), one histogram counts the windows; the slot of a kept
lane comes from one packed scan over the threads (``_kept_slots``).

Safety (used by the merge): every finite x > G = max_t g_t is a candidate, so any threshold
tau > G computed on the candidates alone is exact. A block with more than KT values tied at
its max stores nothing (g_t = m_t): flat and tie-heavy rows go to the exact fallback.

With CD (contrastive decoding) the row is the contrastive score of the expert logits and the
amateur logits (kernels/common.py ``_cd_scores``), cut to the head of the *block's* expert max:
a superset of the row's head. The block also writes that max and the smallest expert logit on
its head, and the merge re-reads (``_block_stats`` with the row's max) only blocks whose local
head holds a token outside the row's head; blocks whose max is outside it are emptied.

A greedy row (T == 0) of a call that asks only tokens and logprobs reads as a greedy block
(``_block_greedy``, GREEDY / GREEDY_ROWS): one 3-operand reduction (max xp, its lowest lane,
the NaN count) and one candidate, the block's first maximum, which is all the merge's greedy
path reads; no exponentials, windows or slot scan.

Reads: the block (V * s bytes per row in all; + V * s_a of amateur logits with CD) and its own
history edits; writes 8 words of statistics per block plus 8 bytes per candidate (+2 words
with CD).
"""
import triton
import triton.language as tl

from .common import (NBIN, _band_bin, _band_scale, _better, _gumbel_fast, _kept_slots_max,
                     _log2e_scale,
                     _maxmin_combine, _pack_cand, _param, _penalised_tile, _pure_row, _quotient,
                     _reciprocal, _row_key, _row_scale)
from .second import NSHARE, _ticket
from .topn import _block_raw, _block_raw_cands, _block_top

# workspace field order (float32 [B, 6, NT] and int32 [B, 5, NT]); F_BX (the best token's xp),
# F_S2 and I_BID are written for pure-temperature rows only (their block's draw partial)
F_M, F_Z, F_LO, F_G, F_BX, F_S2 = (tl.constexpr(i) for i in range(6))
I_NFIN, I_NPOS, I_NNAN, I_NCAND, I_BID = (tl.constexpr(i) for i in range(5))
NF = tl.constexpr(6)
NI = tl.constexpr(5)
# the merge's bound on a pure row's unstored scores: 2^-20 (A + |M| + 64) covers x' - x and the
# roundings between s = fl(x' + G) and fl(fl(x - M) + G), 2^-24 (8 A + 3 |M| + 69) in all
# (kernels/merge.py, "pure temperature")
DRAW_SLACK = tl.constexpr(2.0 ** -20)
# a block whose max |x| (after the temperature) reaches this takes the exact path (_block_stats):
# below it x's own rounding moves a token's mass by <= ulp(x) / 2 <= 2^-18 (4096 left 2^-13,
# logprobs off by up to 1e-4 at |x| ~ 4000: T 0.01 on logits ~ 40, the twenty-second session)
X_EXACT = tl.constexpr(128.0)


@triton.jit
def _block_stats(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT, t, V,
                 rep, pres, freq, tdiv, c2, la, beta, me, k0, k1, hrow, frow, topw, rsw,
                 TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr,
                 NWIN: tl.constexpr, D0_EXP: tl.constexpr, HAS_REP: tl.constexpr,
                 HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                 CD: tl.constexpr, LOCAL: tl.constexpr,
                 R: tl.constexpr, DRAW: tl.constexpr, BANDS: tl.constexpr,
                 TOPN_KB: tl.constexpr, TOPN_RAW: tl.constexpr, TOPN_REUSE: tl.constexpr):
    """Block t's partials and candidates (module docstring), written to the workspace; for a
    pure-temperature row (``pure``, with PURE_OK) its draw partial instead of candidates.
    Returns (expert block max, min expert logit on the block's head) with CD, zeros otherwise."""
    offs, inb, xp, emax, elo, raw = _penalised_tile(
        lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
        TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
        arow, la, beta, me, CD, LOCAL)
    # Statistics in xp (before the temperature): x = fl(xp / T) is monotone in xp, so max, min,
    # windows and candidates carry over, and no lane divides (the merge divides candidates).
    # Blocks with neither NaN nor +inf, whose x does not overflow (all but a few): max xp
    # ignores -inf by itself, and z is NaN exactly when the block holds a NaN or a +inf (or is
    # all -inf, mended below), so the common path tests no lane for them. Flagged blocks redo
    # the block exactly on x, and so do blocks whose max |x| reaches X_EXACT: there x's own
    # rounding (ulp(x) >= 2^-16) no longer vanishes against z's exponent taken on xp, and Z
    # would drift from the masses of the rounded x that the thresholds and the logprob sum
    # (T <~ 0.2 on logits ~ 25).
    vm, lov = tl.reduce((xp, tl.where(xp > float("-inf"), xp, float("inf"))), 0, _maxmin_combine)
    z = tl.sum(tl.math.exp2((xp - vm) * c2), axis=0)
    z = tl.where(vm == float("-inf"), 0.0, z)
    m = _quotient(vm, tdiv)
    lo = _quotient(lov, tdiv)
    npos = tl.zeros([], tl.int32)
    nnan = tl.zeros([], tl.int32)
    v = xp
    # (|m| >= X_EXACT also holds an overflowed m = +inf; z > 0 leaves out all -inf blocks)
    redo = (z != z) | ((tl.abs(m) >= X_EXACT) & (z > 0.0)) | (lo == float("-inf"))
    if redo:
        m, lo, z, v, vm, nnan, npos = _block_redo(xp, tdiv)
    if TOPN_KB > 0:
        _block_topn(raw, xp, offs, inb, topw, rsw, row, NT, t, TILE, TOPN_KB, NWIN, D0_EXP, R,
                    TOPN_RAW, TOPN_REUSE)
    hmask = v > float("-inf")
    if DRAW:
        # a pure row's blocks store their draw partial, no candidates
        _block_draw(v, offs, tdiv, k0, k1, wfrow, wirow, NT, t, TILE)
        # the merge needs of a pure row's count only whether it is 0 (no finite x: the max
        # xp pass) and k < count (never for a pure row, k <= 0 or k >= V > NT): 1 for a block
        # with a finite x (m is the max finite x, also after the redo), no count reduction
        nfin = (m > float("-inf")).to(tl.int32)
        nkeep = nfin * 0
        g = m
    else:
        if BANDS:
            nfin, nkeep, g = _band_cands(v, offs, vm, hmask, tdiv, cand_ptr, hrow, frow, row, NT,
                                         t, TILE, KT, NWIN, D0_EXP, R)
        else:
            nfin, nkeep, g = _block_cands(v, offs, vm, hmask, tdiv, cand_ptr, row, NT, t, TILE,
                                          KT, NWIN, D0_EXP, R)
        if TOPN_REUSE:
            # a redone block (NaN, +inf or an overflowed x) left finite logits out of v: its
            # raw candidates prove nothing (G = +inf sends the row to the row pass)
            _block_raw_cands(rsw, row, NT, t, nkeep, tl.where(redo, float("inf"), g))
        g = _quotient(g, tdiv)
    _store_partials(wfrow, wirow, NT, t, m, z, lo, g, nfin, npos, nnan, nkeep)
    return emax, elo


@triton.jit
def _block_redo(xp, tdiv):
    """A flagged block (NaN, +inf, an overflowed or large x) exactly on x = xp / T: (m, lo, z,
    v = xp on finite x else -inf, max v, NaN count, +inf count)."""
    x = _quotient(xp, tdiv)
    fin = tl.abs(x) < float("inf")
    nnan = tl.sum((x != x).to(tl.int32), axis=0)
    npos = tl.sum((x == float("inf")).to(tl.int32), axis=0)
    m, lo = tl.reduce((tl.where(fin, x, float("-inf")), tl.where(fin, x, float("inf"))), 0,
                      _maxmin_combine)
    z = tl.sum(tl.where(fin, tl.exp(x - m), 0.0), axis=0)
    v = tl.where(fin, xp, float("-inf"))
    vm = tl.max(v, axis=0)
    return m, lo, z, v, vm, nnan, npos


@triton.jit
def _block_topn(raw, xp, offs, inb, topw, rsw, row, NT, t, TILE: tl.constexpr,
                TOPN_KB: tl.constexpr, NWIN: tl.constexpr, D0_EXP: tl.constexpr,
                R: tl.constexpr, TOPN_RAW: tl.constexpr, TOPN_REUSE: tl.constexpr):
    """Top-N logprobs (kernels/topn.py) from this same read: the raw logits, or xp (the
    processed order; not v, whose overflowed lanes are -inf). TOPN_RAW: the block's raw
    candidates, the same windows as the sampling candidates (an upper set of <= TOPN_KB finite
    logits, and the largest one left out), or, with TOPN_REUSE (xp is the raw logits: no
    penalty, mask, bias or CD), those very ones (stored by the caller)."""
    if TOPN_RAW:
        rv, rm = _block_raw(raw, inb, rsw, row, NT, t)
        if not TOPN_REUSE:
            _, rn, rg = _block_cands(rv, offs, rm, rv > float("-inf"), 1.0, topw, row, NT,
                                     t, TILE, TOPN_KB, NWIN, D0_EXP, R)
            _block_raw_cands(rsw, row, NT, t, rn, rg)
    else:
        _block_top(xp, offs, inb, topw, row, NT, t, TOPN_KB)


@triton.jit
def _store_partials(wfrow, wirow, NT, t, m, z, lo, g, nfin, npos, nnan, nkeep):
    """Block t's statistics into the workspace's field-major rows (F_* floats, I_* ints): one
    4-wide store each (a lane a field), where eight scalar stores each set up an address
    (a block's fixed cost; stage 1 at (64, 128256), modelled: -4.6% of its instructions)."""
    tl.static_assert((F_M == 0) & (F_Z == 1) & (F_LO == 2) & (F_G == 3))
    tl.static_assert((I_NFIN == 0) & (I_NPOS == 1) & (I_NNAN == 2) & (I_NCAND == 3))
    # the lanes' offsets in 32 bits, added to each base per store: a 64-bit lane address
    # would be hoisted out of the block loop and held through it (16 bytes spilled in the
    # greedy + per-row + pf + mask + bias variant at the 64 cap)
    i = tl.arange(0, 4)
    f = tl.where(i == 0, m, tl.where(i == 1, z, tl.where(i == 2, lo, g)))
    n = tl.where(i == 0, nfin, tl.where(i == 1, npos, tl.where(i == 2, nnan, nkeep)))
    tl.store(wfrow + (i * NT + t), f)
    tl.store(wirow + (i * NT + t), n)


@triton.jit
def _block_bands(v, vm, hmask, tdiv, hrow, frow, t):
    """The band read's estimate (kernels/band.py): F_t = floor(vm s), s = BAND_S / T, and the
    count of the block's finite tokens per bin j = min(F_t - floor(xp s), NBIN - 1) (bin j of
    block t covers x ~ [(F_t - j) / BAND_S, (F_t - j + 1) / BAND_S)): NBIN int16 + 1 float,
    260 bytes per block. v is -inf where xp is not finite (the block's exact redo did that).
    Returns (each lane's bin, the counts)."""
    s = _band_scale(tdiv)
    F = tl.floor(vm * s)
    # clamped: past |F| = 2^24 _band_bin can give NBIN (common.py), which the histogram would
    # drop from the counts (and nfin); such blocks lie outside every band plan's window
    j = tl.minimum(_band_bin(v, F, s), NBIN - 1)
    h = tl.histogram(j, NBIN, mask=hmask)
    tl.store(hrow + t * NBIN + tl.arange(0, NBIN), h.to(tl.int16))
    tl.store(frow + t, F)
    return j, h


@triton.jit
def _band_cands(v, offs, vm, hmask, tdiv, cand_ptr, hrow, frow, row, NT, t, TILE: tl.constexpr,
                KT: tl.constexpr, NWIN: tl.constexpr, D0_EXP: tl.constexpr, R: tl.constexpr):
    """With BANDS (a launch that can have a top-p row without top-k): the band read's estimate
    (_block_bands) and the block's candidates from that one histogram, without one of their
    own: _block_cands' windows {vm - xp <= D0 2^j} (j < NWIN - 1), each as the top bins
    [0, e_j], e_j = min(ceil(D0 2^j BAND_S / T) - 1, NBIN - 2) (a bin is 1 / BAND_S unit of
    x = xp / T; its floor-aligned edges move a window by less than a bin), the widest holding
    <= KT tokens, else every finite value if the block holds <= KT (bin NBIN - 1 is every
    bin below), else none. An upper set of xp. Returns (nfin, ncand, the largest v not
    stored)."""
    tl.static_assert((KT < 2048) & (TILE < 4096))
    j, h = _block_bands(v, vm, hmask, tdiv, hrow, frow, t)
    w = tl.arange(0, NWIN)
    ends = tl.ceil(tl.exp2((w + D0_EXP).to(tl.float32)) * _band_scale(tdiv)) - 1.0
    ends = tl.where(w == NWIN - 1, NBIN - 1,
                    tl.minimum(tl.maximum(ends, 0.0), NBIN - 2.0).to(tl.int32))
    cum = tl.gather(tl.cumsum(h, 0), ends, 0)
    ok = cum <= KT
    # the widest window kept (its last bin + 1), its tokens and nfin in one packed sum
    widest = ok & ((w == NWIN - 1) | (tl.gather(ok.to(tl.int32), tl.minimum(w + 1, NWIN - 1),
                                                  0) == 0))
    packed = tl.sum(tl.where(widest, (ends + 1) + (cum << 8), 0)
                    + tl.where(w == NWIN - 1, cum << 19, 0), axis=0)
    g = _store_cands(hmask & (j < (packed & 255)), v, offs, cand_ptr, row, NT, t, TILE, KT, R)
    return packed >> 19, (packed >> 8) & 2047, g


@triton.jit
def _block_draw(v, offs, tdiv, k0, k1, wfrow, wirow, NT, t, TILE: tl.constexpr):
    """A pure-temperature block's draw partial: its best approximate score s = fl(x' + G)
    (x' = max(fl(xp * fl(1 / T)), -FLT_MAX), within 4 ulps of x = xp / T; G the token's Gumbel
    noise; lowest id on ties), that token's xp and id, and s2, the largest s of every other
    token of the block.
    The merge recomputes the exact score fl(fl(xp / T - M) + G) of each block's best and
    proves the row's winner against the bounds s2 (kernels/README.md); x = -inf tokens (and
    padding lanes) never score. Per lane: the hash, two short-polynomial logs (_gumbel_fast),
    one multiply: s only has to be close (no division, no libdevice log), the merge's slack
    covers x' - x and G's GUMBEL_FAST_ERR, and it recomputes each block's best with _gumbel."""
    # x' is clamped at -FLT_MAX: near it the product can overflow where the quotient does not
    # (x finite, x' = -inf), and such a token must still score (or s = -inf + inf = NaN)
    rinv = _reciprocal(tdiv)  # fl(1 / T): the bound above takes it rounded
    xq = tl.maximum(v * rinv, -3.4028234663852886e38)
    s = tl.where(v > float("-inf"), xq + _gumbel_fast(k0, k1, offs), float("-inf"))
    lane = tl.arange(0, TILE)
    _, ib, s2 = tl.reduce((s, lane, tl.full([TILE], float("-inf"), tl.float32)), 0, _top2)
    bxp = tl.max(tl.where(lane == ib, v, float("-inf")), axis=0)
    tl.store(wfrow + F_BX * NT + t, bxp)
    tl.store(wfrow + F_S2 * NT + t, s2)
    tl.store(wirow + I_BID * NT + t, (t * TILE + ib).to(tl.int32))


@triton.jit
def _top2(b, i, t, cb, ci, ct):
    """(best score, its lane, the largest score of every other lane) as a reduction: the draw's
    rule for the best (common._better: the lower lane on a tie) and the runner-up as the max of
    both sides' runners-up and the loser's best (a tie's loser carries the same score). One
    reduction for what tl.argmax and a masked max did (a pure row's stage 1 at (64, 128256),
    modelled: 6538 -> 5947 instructions a warp; the best's xp in the tuple too spilled 4 bytes
    at the 72 cap)."""
    best, lane, _ = _better(b, i, t, cb, ci, ct)
    return best, lane, tl.maximum(tl.maximum(t, ct), tl.minimum(b, cb))


@triton.jit
def _greedy_combine(v1, i1, n1, v2, i2, n2):
    """(max, its lowest lane, summed count): the draw's own rule (common._better: the larger,
    the lower id on a tie). NaN operands lose every comparison, so a block holding one gets
    some finite or NaN max here and is redone (its count is > 0)."""
    v, i, _ = _better(v1, i1, v1, v2, i2, v2)
    return v, i, n1 + n2


@triton.jit
def _block_greedy(lrow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT, t, V, rep, pres,
                  freq, TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr,
                  HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """Block t of a greedy row (x = xp; the token is the row's first max xp) in a call that
    asks only tokens and logprobs: m_t = max finite xp, the counts the merge tests (nfin as 0
    / 1, as a pure row's), and one candidate, the block's first token holding m_t (none if
    m_t = -inf or the block holds a +inf: the merge re-reads that block), which is all the
    merge's greedy path reads (merge.py _first_index). One 3-operand reduction a block (max,
    lowest lane, NaN count); no exponentials, windows or candidate scan. z_t, lo_t and g_t
    are 1 / m_t / m_t (g_t = m_t: "every value may be unstored"): a greedy row's Z, bounds
    and thresholds are never read (its logprob is 0)."""
    offs, inb, xp, _, _, _ = _penalised_tile(
        lrow, erow, brow, xrow, NT, t, V, rep, pres, freq, TILE, E_BLOCK, HAS_REP, HAS_PF,
        HAS_MASK, HAS_BIAS, lrow, 0.0, 0.0, 0.0, False, False)
    lane = tl.arange(0, TILE)
    m, ib, nnan = tl.reduce((xp, lane, (xp != xp).to(tl.int32)), 0, _greedy_combine)
    npos = nnan * 0
    if (nnan > 0) | (m == float("inf")):
        # rare: NaN or +inf in the block. The merge needs nnan, npos and the max finite xp,
        # and no candidate (it re-reads the block of a row's first +inf; NaN: invalid)
        fin = tl.abs(xp) < float("inf")
        npos = tl.sum((xp == float("inf")).to(tl.int32), axis=0)
        m = tl.max(tl.where(fin, xp, float("-inf")), axis=0)
    nc = ((m > float("-inf")) & (npos == 0) & (nnan == 0)).to(tl.int32)
    if nc > 0:
        tl.store(cand_ptr + (row * NT + t) * KT, _pack_cand(m, t * TILE + ib))
    _store_partials(wfrow, wirow, NT, t, m, tl.where(m > float("-inf"), 1.0, 0.0), m, m,
                    (m > float("-inf")).to(tl.int32), npos, nnan, nc)


@triton.jit
def _block_cands(v, offs, vm, hmask, tdiv, cand_ptr, row, NT, t, TILE: tl.constexpr,
                 KT: tl.constexpr, NWIN: tl.constexpr, D0_EXP: tl.constexpr, R: tl.constexpr):
    """The block's candidates (module docstring): (nfin, ncand, the largest v not stored)."""
    # windows W_j = {v : fl(vm - v) <= D0 * 2^j} (j < 7, D0 = 2^D0_EXP), the last one every
    # counted lane: keep the widest window holding <= KT values (none if more than KT lie
    # within D0 of the max). k = the first window holding v, read off the exponent of
    # d = fl(vm - v): k = ceil(log2(d / D0)) clamped to [0, 7]. d is monotone in v, so every
    # window is an upper set. A histogram of k over the counted lanes counts them.
    tl.static_assert(NWIN == 8)
    db = (vm - v).to(tl.int32, bitcast=True)
    k = tl.minimum(tl.maximum(((db - 1) >> 23) - (126 + D0_EXP), 0), NWIN - 1)
    h = tl.histogram(k, NWIN, mask=hmask)
    # N_j = sum_{i <= j} h_i; the windows with N_j <= KT are a prefix: count them and their
    # lanes, with nfin, in one packed sum
    bins = tl.arange(0, NWIN)
    ok = (bins < NWIN - 1) & (tl.cumsum(tl.where(bins < NWIN - 1, h, 0), 0) <= KT)
    packed = tl.sum(h + tl.where(ok, (h << 15) + (1 << 12), 0), axis=0)
    nfin = packed & 4095
    jsel = ((packed >> 12) & 7) - 1
    nkeep = (packed >> 15) & 4095
    jsel = tl.where(nfin <= KT, NWIN - 1, jsel)
    nkeep = tl.where(nfin <= KT, nfin, nkeep)
    g = _store_cands(hmask & (k <= jsel), v, offs, cand_ptr, row, NT, t, TILE, KT, R)
    return nfin, nkeep, g


@triton.jit
def _store_cands(keep, v, offs, cand_ptr, row, NT, t, TILE: tl.constexpr, KT: tl.constexpr,
                 R: tl.constexpr):
    """The kept lanes (xp, id) into block t's first slots, in id order; returns the largest v
    not stored, which comes out of the slots' own reduction."""
    pos, g = _kept_slots_max(keep, tl.where(keep, float("-inf"), v), TILE, R)
    cbase = (row * NT + t) * KT
    tl.store((cand_ptr + cbase) + pos, _pack_cand(v, offs), mask=keep)
    return g


@triton.jit
def _row_bases(logits_ptr, stride_lb, am_ptr, stride_ab, edits_ptr, stride_eb, bnd_ptr, x_ptr,
               stride_xb, wf_ptr, wi_ptr, row, NT, HDIRECT: tl.constexpr):
    """Row ``row``'s bases: logits, amateur logits (CD), history edits, their per-block bounds,
    mask / bias words, and the workspace's float and int partials. With HDIRECT (no bucketed
    history) edits_ptr is the [B, L] ids (stride_eb = L), and the blocks take L where the
    bounds were (kernels/common.py _penalised_tile)."""
    lrow = logits_ptr + row * stride_lb
    arow = am_ptr + row * stride_ab
    erow = edits_ptr + row * stride_eb
    brow = bnd_ptr + row * 2 * NT
    if HDIRECT:
        brow = (row * 0 + stride_eb).to(tl.int32)
    xrow = x_ptr + row * stride_xb
    wfrow = wf_ptr + row * NF * NT
    wirow = wi_ptr + row * NI * NT
    return lrow, arow, erow, brow, xrow, wfrow, wirow


@triton.jit(do_not_specialize=["TPC", "stride_lb", "stride_ab", "topk_s", "seed_s", "off_s"])
def _stats_kernel(
    logits_ptr, stride_lb, V, NT, TPC,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    topk_ptr, topk_s, topp_ptr, topp_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
    wf_ptr, wi_ptr, cand_ptr, hb_ptr, ft_ptr, topw_ptr, rs_ptr, cnt_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s, wc_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    TOPK_T: tl.constexpr, TOPP_T: tl.constexpr, MINP_T: tl.constexpr, SEED_T: tl.constexpr,
    OFF_T: tl.constexpr, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
    HAS_MINP: tl.constexpr, PURE_OK: tl.constexpr,
    HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
    TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr, NWIN: tl.constexpr,
    D0_EXP: tl.constexpr, LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr,
    R: tl.constexpr, BANDS: tl.constexpr, TOPN_KB: tl.constexpr, TOPN_RAW: tl.constexpr,
    TOPN_REUSE: tl.constexpr, HDIRECT: tl.constexpr = False, GREEDY: tl.constexpr = False,
    GREEDY_ROWS: tl.constexpr = False, SHARE: tl.constexpr = False,
):
    """Grid (B, C). Reads each logit once (and its block's history edits); writes per block
    8 words of statistics and 8 bytes per candidate, or, for a pure-temperature row (PURE_OK:
    a sampling launch without CD), 3 words of draw partial instead of candidates. Pure rows pay
    the Gumbel noise (hash + 2 logs) and x = xp / T on every lane here, which is what lets the
    merge skip the second pass over the row that v2 needed for them. With BANDS (a launch that
    can have a top-p row without top-k) every other row's blocks also write the band read's
    estimate (_block_bands: 128 int16 counts + F_t, 260 bytes per block). With TOPN_KB > 0
    (top-N logprobs) every block also writes its TOPN_KB best keys (kernels/topn.py: 8 bytes
    each, + 12 bytes of raw partials with TOPN_RAW). GREEDY (a scalar T = 0) compiles only the
    greedy blocks; GREEDY_ROWS (a tensor T) sends each row with T == 0 to them (both only in
    calls asking tokens and logprobs: sampling._greedy_reads). With SHARE (a launch whose rows
    may take a second read) program (0, 0) resets the merge's counts of such rows (cnt, int32
    [NSHARE]: kernels/second.py _row_share) and program (row, 0) its row's gather ticket."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if SHARE:
        if (row == 0) & (c == 0):
            tl.store(cnt_ptr + tl.arange(0, NSHARE), tl.zeros([NSHARE], tl.int32))
        if c == 0:
            tl.store(_ticket(cnt_ptr, row), 0)
    lrow, arow, erow, brow, xrow, wfrow, wirow = _row_bases(
        logits_ptr, stride_lb, am_ptr, stride_ab, edits_ptr, stride_eb, bnd_ptr, x_ptr,
        stride_xb, wf_ptr, wi_ptr, row, NT, HDIRECT)

    T, rep, pres, freq, tdiv = _row_scale(
        temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
        TEMP_T, REP_T, PRES_T, FREQ_T)
    la = _param(la_ptr, la_s, row, LA_T)
    beta = _param(beta_ptr, beta_s, row, BETA_T)
    c2 = _log2e_scale(tdiv)
    pure = tl.zeros([], tl.int1)
    if PURE_OK:
        k = _param(topk_ptr, topk_s, row, TOPK_T, tl.int64)
        p = _param(topp_ptr, topp_s, row, TOPP_T)
        lminp = _param(minp_ptr, minp_s, row, MINP_T)
        pure = _pure_row(T, k, p, lminp, V, HAS_TOPK, HAS_TOPP, HAS_MINP)

    t_end = tl.minimum(c * TPC + TPC, NT)
    # GREEDY (a scalar T = 0) compiles only the greedy loop; with GREEDY_ROWS (a tensor T) a
    # greedy row takes it in a row-uniform branch, as the pure rows take theirs
    greedy = GREEDY
    if not GREEDY:
        if GREEDY_ROWS:
            greedy = T == 0.0
    if greedy:
        _greedy_loop(lrow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT, c * TPC, t_end, V,
                     rep, pres, freq, TILE, E_BLOCK, KT, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS)
    else:
        _sampling_loops(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, wc_ptr, row, NT,
                        c * TPC, t_end, V, rep, pres, freq, tdiv, c2, la, beta, pure, seed_ptr,
                        seed_s, off_ptr, off_s, hb_ptr, ft_ptr, topw_ptr, rs_ptr, SEED_T, OFF_T,
                        PURE_OK, TILE, E_BLOCK, KT, NWIN, D0_EXP, HAS_REP, HAS_PF, HAS_MASK,
                        HAS_BIAS, CD, R, BANDS, TOPN_KB, TOPN_RAW, TOPN_REUSE)


@triton.jit
def _sampling_loops(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, wc_ptr, row, NT, t0,
                    t_end, V, rep, pres, freq, tdiv, c2, la, beta, pure, seed_ptr, seed_s,
                    off_ptr, off_s, hb_ptr, ft_ptr, topw_ptr, rs_ptr, SEED_T: tl.constexpr,
                    OFF_T: tl.constexpr, PURE_OK: tl.constexpr, TILE: tl.constexpr,
                    E_BLOCK: tl.constexpr, KT: tl.constexpr, NWIN: tl.constexpr,
                    D0_EXP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
                    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, CD: tl.constexpr,
                    R: tl.constexpr, BANDS: tl.constexpr, TOPN_KB: tl.constexpr,
                    TOPN_RAW: tl.constexpr, TOPN_REUSE: tl.constexpr):
    """Stage 1's blocks [t0, t_end) of a row that is not read as greedy: a pure-temperature
    row's draw partials (with PURE_OK), else partials and candidates."""
    if PURE_OK:
        if pure:
            # a row-uniform branch around its own loop, so the draw's registers and the
            # candidates' are allocated apart (one loop holding both spilled under the 64 cap)
            k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
            for t in range(t0, t_end):
                _block_stats(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT,
                             t, V, rep, pres, freq, tdiv, c2, la, beta, tdiv * 0.0, k0, k1,
                             hb_ptr, ft_ptr, topw_ptr, rs_ptr,
                             TILE, E_BLOCK, KT, NWIN, D0_EXP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                             False, True, R,
                             True, False, TOPN_KB, TOPN_RAW, False)
        else:
            _cand_loop(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, wc_ptr, row, NT, t0,
                       t_end, V, rep, pres, freq, tdiv, c2, la, beta,
                       hb_ptr + row * NT * NBIN, ft_ptr + row * NT, topw_ptr, rs_ptr, TILE,
                       E_BLOCK, KT, NWIN, D0_EXP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD, R,
                       BANDS, TOPN_KB, TOPN_RAW, TOPN_REUSE)
    else:
        _cand_loop(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, wc_ptr, row, NT, t0,
                   t_end, V, rep, pres, freq, tdiv, c2, la, beta,
                   hb_ptr + row * NT * NBIN, ft_ptr + row * NT, topw_ptr, rs_ptr, TILE, E_BLOCK,
                   KT, NWIN, D0_EXP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD, R, BANDS, TOPN_KB,
                   TOPN_RAW, TOPN_REUSE)


@triton.jit
def _greedy_loop(lrow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT, t0, t_end, V, rep,
                 pres, freq, TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr,
                 HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                 HAS_BIAS: tl.constexpr):
    """Stage 1's blocks [t0, t_end) of a greedy row (_block_greedy)."""
    for t in range(t0, t_end):
        _block_greedy(lrow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT, t, V, rep, pres,
                      freq, TILE, E_BLOCK, KT, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS)


@triton.jit
def _cand_loop(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, wc_ptr, row, NT, t0, t_end, V,
               rep, pres, freq, tdiv, c2, la, beta, hrow, frow, topw, rsw, TILE: tl.constexpr,
               E_BLOCK: tl.constexpr, KT: tl.constexpr, NWIN: tl.constexpr, D0_EXP: tl.constexpr,
               HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
               HAS_BIAS: tl.constexpr, CD: tl.constexpr, R: tl.constexpr, BANDS: tl.constexpr,
               TOPN_KB: tl.constexpr, TOPN_RAW: tl.constexpr, TOPN_REUSE: tl.constexpr):
    """Stage 1's blocks [t0, t_end) of a row with thresholds (or greedy): partials and
    candidates per block."""
    zero = tl.zeros([], tl.uint32)
    for t in range(t0, t_end):
        emax, elo = _block_stats(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT,
                                 t, V, rep, pres, freq, tdiv, c2, la, beta, tdiv * 0.0,
                                 zero, zero, hrow, frow, topw, rsw, TILE, E_BLOCK, KT, NWIN,
                                 D0_EXP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                                 CD, True, R, False, BANDS, TOPN_KB, TOPN_RAW, TOPN_REUSE)
        if CD:
            # the block's own expert max and its head's min expert logit: the merge finds the
            # row's max and re-reads only the blocks whose local head is wider than the row's
            tl.store(wc_ptr + row * 2 * NT + t, emax)
            tl.store(wc_ptr + row * 2 * NT + NT + t, elo)
