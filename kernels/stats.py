"""Stage 1: one read of the logits. Per statistics block: partial statistics and candidates.

Grid (B, C): program (row, c) owns the blocks [c * TPC, (c + 1) * TPC) of its row, each TILE
tokens wide. Everything it writes is per *block*, never per program, so what lands in the
workspace does not depend on the chunk count C (the merge then reduces blocks in index order).

Per block t (finite = not NaN, not +-inf):
    m_t, z_t      max finite x and sum exp(x - m_t)           (online softmax partials)
    lo_t          min finite x                                 (bracket for the fallback search)
    xpmax_t, i_t  max xp over non-NaN and its first index       (greedy; the overflow rule)
    nfin, n+inf, nnan   counts
    candidates    the block's top finite values and their ids, at most KT of them: the
                  values in the widest window [m_t - D0 * 2^j, m_t] (j < NWIN - 1; the last
                  window is every finite value) that holds <= KT values, an upper set. Stored
                  in id order; the rest of the block's KT value slots is -inf.
    g_t           max finite x *not* stored (-inf if every finite value is a candidate)

Safety (used by the merge): every finite x > G = max_t g_t is a candidate, so any threshold
tau > G computed on the candidates alone is exact. A block with more than KT values tied at
its max stores nothing (g_t = m_t): flat and tie-heavy rows go to the exact fallback.

With CD (contrastive decoding) the row is the contrastive score of the expert logits and the
amateur logits (kernels/common.py ``_cd_scores``), cut to the head of the *block's* expert max:
a superset of the row's head. The block also writes that max and the smallest expert logit on
its head, and the merge re-reads (``_block_stats`` with the row's max) only blocks whose local
head holds a token outside the row's head; blocks whose max is outside it are emptied.

Reads: the block (V * s bytes per row in all; + V * s_a of amateur logits with CD) and its own
history edits; writes 10 words of statistics per block plus 8 bytes per candidate (+2 with CD).
"""
import triton
import triton.language as tl

from .common import _bad_row, _param, _penalised_tile

# workspace field order (float32 [B, 5, NT] and int32 [B, 5, NT])
F_M, F_Z, F_LO, F_XPMAX, F_G = (tl.constexpr(i) for i in range(5))
I_NFIN, I_NPOS, I_NNAN, I_NCAND, I_GIDX = (tl.constexpr(i) for i in range(5))
NF = tl.constexpr(5)
NI = tl.constexpr(5)


@triton.jit
def _block_combine(v1, i1, m1, l1, v2, i2, m2, l2):
    """(max with its first index, max, min): each order-free, so one tree gives the same bits."""
    left = (v1 > v2) | ((v1 == v2) & (i1 < i2))
    return (tl.where(left, v1, v2), tl.where(left, i1, i2), tl.maximum(m1, m2),
            tl.minimum(l1, l2))


@triton.jit
def _add2_combine(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _block_stats(lrow, arow, erow, brow, wfrow, wirow, cv_ptr, ci_ptr, row, NT, t, V,
                 rep, pres, freq, tdiv, la, beta, me,
                 TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr,
                 NWIN: tl.constexpr, D0: tl.constexpr, HAS_REP: tl.constexpr,
                 HAS_PF: tl.constexpr, CD: tl.constexpr, LOCAL: tl.constexpr):
    """Block t's partials and candidates (module docstring), written to the workspace.
    Returns (expert block max, min expert logit on the block's head) with CD, zeros otherwise."""
    offs, inb, xp, emax, elo = _penalised_tile(lrow, erow, brow, NT, t, V, rep, pres, freq,
                                               TILE, E_BLOCK, HAS_REP, HAS_PF,
                                               arow, la, beta, me, CD, LOCAL)
    x = xp / tdiv
    isnan = xp != xp
    xg = tl.where(isnan, float("-inf"), xp)
    fin = (x > float("-inf")) & (x < float("inf"))
    # max xp / its first index, max and min finite x: one reduction (one barrier, not three)
    xpmax, amax, m, lo = tl.reduce((xg, tl.arange(0, TILE), tl.where(fin, x, float("-inf")),
                                    tl.where(fin, x, float("inf"))), 0, _block_combine)
    gidx = t * TILE + amax
    z = tl.sum(tl.where(fin, tl.exp(x - m), 0.0), axis=0)

    # windows [m - D_j, m], D_j = D0 * 2^j (j < 7), the last one everything finite: keep the
    # widest window holding <= KT values (none if more than KT lie within D0 of the max).
    # k = the first window holding x; its histogram (7 bins) and the nfin / +inf / NaN counts
    # are packed 11 bits a field into two int64 and summed in one reduction
    tl.static_assert(NWIN == 8)
    k = tl.full([TILE], NWIN - 1, tl.int32)
    for jj in tl.static_range(NWIN - 1):
        k -= (x >= m - D0 * (1 << jj)).to(tl.int32)
    lowk = fin & (k < 4)
    highk = fin & (k >= 4) & (k < NWIN - 1)
    one = tl.full([TILE], 1, tl.int64)
    pa = tl.where(lowk, one << (11 * (k & 3)).to(tl.int64), 0) + (isnan.to(tl.int64) << 44)
    pb = (tl.where(highk, one << (11 * ((k - 4) & 3)).to(tl.int64), 0) + (fin.to(tl.int64) << 33)
          + ((x == float("inf")).to(tl.int64) << 44))
    pa, pb = tl.reduce((pa, pb), 0, _add2_combine)
    nfin = ((pb >> 33) & 2047).to(tl.int32)
    # N_j = values in window j (cumulative); nsel = windows with N_j <= KT; keep window nsel-1
    nwin = tl.zeros([], tl.int32)
    nkeep = tl.zeros([], tl.int32)
    thr = tl.full([], float("inf"), tl.float32)
    for jj in tl.static_range(NWIN - 1):
        if jj < 4:
            nwin += ((pa >> (11 * jj)) & 2047).to(tl.int32)
        else:
            nwin += ((pb >> (11 * (jj - 4))) & 2047).to(tl.int32)
        ok = nwin <= KT
        thr = tl.where(ok, m - D0 * (1 << jj), thr)
        nkeep = tl.where(ok, nwin, nkeep)
    ok = nfin <= KT
    thr = tl.where(ok, float("-inf"), thr)
    nkeep = tl.where(ok, nfin, nkeep)
    keep = fin & (x >= thr)
    pos = tl.cumsum(keep.to(tl.int32), 0) - 1
    cbase = (row * NT + t) * KT
    tl.store(cv_ptr + cbase + pos, x, mask=keep)
    tl.store(ci_ptr + cbase + pos, offs.to(tl.int32), mask=keep)
    g = tl.max(tl.where(fin & (~keep), x, float("-inf")), axis=0)
    kl = tl.arange(0, KT)
    tl.store(cv_ptr + cbase + kl, tl.full([KT], float("-inf"), tl.float32), mask=kl >= nkeep)

    tl.store(wfrow + F_M * NT + t, m)
    tl.store(wfrow + F_Z * NT + t, z)
    tl.store(wfrow + F_LO * NT + t, lo)
    tl.store(wfrow + F_XPMAX * NT + t, xpmax)
    tl.store(wfrow + F_G * NT + t, g)
    tl.store(wirow + I_NFIN * NT + t, nfin)
    tl.store(wirow + I_NPOS * NT + t, ((pb >> 44) & 2047).to(tl.int32))
    tl.store(wirow + I_NNAN * NT + t, ((pa >> 44) & 2047).to(tl.int32))
    tl.store(wirow + I_NCAND * NT + t, nkeep)
    tl.store(wirow + I_GIDX * NT + t, gidx.to(tl.int32))
    return emax, elo


@triton.jit(do_not_specialize=["TPC"])
def _stats_kernel(
    logits_ptr, stride_lb, V, NT, TPC,
    edits_ptr, stride_eb, bnd_ptr,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    wf_ptr, wi_ptr, cv_ptr, ci_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s, wc_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
    TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr, NWIN: tl.constexpr,
    D0: tl.constexpr, LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lrow = logits_ptr + row * stride_lb
    arow = am_ptr + row * stride_ab
    erow = edits_ptr + row * stride_eb
    brow = bnd_ptr + row * 2 * NT
    wfrow = wf_ptr + row * NF * NT
    wirow = wi_ptr + row * NI * NT

    T = _param(temp_ptr, temp_s, row, TEMP_T)
    rep = _param(rep_ptr, rep_s, row, REP_T)
    pres = _param(pres_ptr, pres_s, row, PRES_T)
    freq = _param(freq_ptr, freq_s, row, FREQ_T)
    la = _param(la_ptr, la_s, row, LA_T)
    beta = _param(beta_ptr, beta_s, row, BETA_T)
    tdiv = tl.where((T == 0.0) | _bad_row(T, rep, pres, freq), 1.0, T)

    t_end = tl.minimum(c * TPC + TPC, NT)
    for t in range(c * TPC, t_end):
        emax, elo = _block_stats(lrow, arow, erow, brow, wfrow, wirow, cv_ptr, ci_ptr, row, NT,
                                 t, V, rep, pres, freq, tdiv, la, beta, tdiv * 0.0,
                                 TILE, E_BLOCK, KT, NWIN, D0, HAS_REP, HAS_PF, CD, True)
        if CD:
            # the block's own expert max and its head's min expert logit: the merge finds the
            # row's max and re-reads only the blocks whose local head is wider than the row's
            tl.store(wc_ptr + row * 2 * NT + t, emax)
            tl.store(wc_ptr + row * 2 * NT + NT + t, elo)
