"""The band read: top-p rows (no top-k) whose nucleus outgrew the candidates, in a second read
over the whole grid instead of the merge's row pass (one program, a pass per search round).

Estimate, then validate (kernels/README.md, "v4"; bench/window_sim.py is the float64 study):

    stage 1 (BANDS)      per block t: F_t = floor(vm_t s), s = 8 / T, and an int16 count of its
                         finite tokens per bin j = min(F_t - floor(xp s), 127)
    _band_plan_kernel    grid (B,)    row bins J = j + (Fmax - F_t); the boundary bin Jb from the
                                      estimated masses, the band [Ja, Jc] around it (<= CAP
                                      tokens by the counts), per-block offsets into the list
    _band_gather_kernel  grid (B, C)  the second read: per block the exact mass / min-p mass /
                                      best Gumbel score of the tokens above the band, the
                                      smallest x above it and the largest x below it; the
                                      band's tokens (x, id) appended at the block's offset
    _band_finish_kernel  grid (B,)    validate, search tau on the band, draw, logprob; a row
                                      that fails takes merge.py's row pass here (same answer)

Math (x = fl(xp / T), e = e^(x - M), M and Z as the merge has them: merge._row_mz). Bin j of block t covers
x ~ [(F_t - j) / 8, (F_t - j + 1) / 8), so its mass is estimated as
count e^((F_t - j) / 8 - M) 8 (e^(1/8) - 1) (a uniform density inside the bin). The plan takes
the smallest row edge E with Z - W_est(J >= E) >= p Z (bisection: masked sums over the
[NT, 128] counts, no scatter-add), Jb = E - 1, and grows [Jb, Jb] by the smaller neighbour
while the counted tokens stay <= CAP. Every kernel bins a token with common.py's _band_bin on
the same xp and stage 1's F_t, so the band is a set of bins, the same in all of them: the
counts are exact and the list never overflows. Unclamped, J = Fmax - floor(xp s) whatever the
block, monotone in xp, so above / band / below are upper sets of xp.

Validation (finish): W_a < p Z <= W_a + W_band (tau lies in the band), then tau = the pivot
search on the band with target p Z - W_a (merge.py's _cand_search), and
max x below < tau <= min x above (no tie group of x straddles an edge). Then every kept token
(x >= tau, e >= min_p) is above the band or in it: Z_f = W_a,kept + band kept mass, the token
the best of the blocks' above-winners and the band's kept lanes (Gumbel noise by id, lowest id
on ties), logprob = x_tok - M - log Z_f. Everything is per block or over the list in block
order (fixed trees), so the result is the same for any chunk count and batch.

Passes over the logits for these rows: 1 (stage 1) + 1 (gather), both over (B, C); a failed row
pays the row pass on top (its gather is skipped when the plan already failed). Bytes besides:
260 per block (stage 1's estimate, written once, read by the plan), 28 per block (gather
partials), 8 per band token (written once, read once per search round + once to draw).
"""
import triton
import triton.language as tl

from .common import (BAND_S, NBIN, SHIFT_MAX, _band_bin, _band_shift, _gumbel, _param,
                     _penalised_tile, _row_key, _row_scale)
from .merge import B_FMAX, B_M, B_Z, BAND_ROW, NBF, _cand_search, _row_mz, _row_pass
from .stats import F_LO, NF

# the plan's int32 per row [B, NBI]: band found, its row bins [Ja, Jc], its token count
I_OK, I_JA, I_JC, I_N = (tl.constexpr(i) for i in range(4))
NBI = tl.constexpr(4)
# the gather's per-block partials (float32 [B, NG, NT], int32 [B, NT]: the above-winner's id)
G_WA, G_WK, G_S, G_X, G_AMIN, G_BMAX = (tl.constexpr(i) for i in range(6))
NG = tl.constexpr(6)
# one past the largest row bin (shifts are clamped at SHIFT_MAX)
J_END = tl.constexpr(int(SHIFT_MAX.value) + NBIN.value)
# 8 (e^(1/8) - 1): a bin's mass over its lower edge's e^(x - M), uniform density
BIN_MASS = tl.constexpr(1.0651876887826498)


@triton.jit
def _bins_chunk(hrow, frow, NT, t0, fmax, TB: tl.constexpr):
    """Blocks [t0, t0 + TB): their counts [TB, NBIN] (float), row bins J [TB, NBIN] and
    shifts [TB]."""
    tb = t0 + tl.arange(0, TB)
    tin = tb < NT
    F = tl.load(frow + tb, mask=tin, other=float("-inf"))
    sh = _band_shift(fmax, F)
    j = tl.arange(0, NBIN)
    h = tl.load(hrow + tb[:, None] * NBIN + j[None, :], mask=tin[:, None], other=0)
    return h.to(tl.float32), j[None, :] + sh[:, None], sh


@triton.jit
def _est_tail(hrow, frow, NT, fmax, M, E, TB: tl.constexpr):
    """Estimated mass of the row bins J >= E (module docstring). The bin's e^((Fmax - J)/8 - M)
    factors into a per-block e^((Fmax - shift_t)/8 - M) and a per-bin e^(-j/8): TB + NBIN
    exponentials a chunk instead of TB * NBIN (the exp pipe bounded the bisection)."""
    acc = tl.zeros([TB, NBIN], tl.float32)
    eb = tl.exp(-tl.arange(0, NBIN).to(tl.float32) / BAND_S)
    for t0 in range(0, NT, TB):
        h, J, sh = _bins_chunk(hrow, frow, NT, t0, fmax, TB)
        ea = tl.exp((fmax - sh.to(tl.float32)) / BAND_S - M)
        acc += tl.where(J >= E, h * ea[:, None] * eb[None, :], 0.0)
    return tl.sum(tl.sum(acc, axis=1), axis=0) * BIN_MASS


@triton.jit
def _count2(hrow, frow, NT, fmax, a, c, TB: tl.constexpr):
    """Token counts of row bins a and c (one pass over the counts)."""
    na = tl.zeros([TB, NBIN], tl.float32)
    nc = tl.zeros([TB, NBIN], tl.float32)
    for t0 in range(0, NT, TB):
        h, J, _sh = _bins_chunk(hrow, frow, NT, t0, fmax, TB)
        na += tl.where(J == a, h, 0.0)
        nc += tl.where(J == c, h, 0.0)
    return tl.sum(tl.sum(na, axis=1), axis=0), tl.sum(tl.sum(nc, axis=1), axis=0)


@triton.jit
def _boundary_bin(hrow, frow, NT, fmax, M, Z, p, hi, TB: tl.constexpr):
    """Jb = E - 1, E the smallest row edge in [0, hi] with Z - W_est(J >= E) >= p Z (bisection:
    W_est(J >= E) is non-increasing in E and 0 at hi, one past the row's largest bin)."""
    lo = tl.zeros([], tl.int32)
    while lo < hi:
        mid = (lo + hi) // 2
        ok = Z - _est_tail(hrow, frow, NT, fmax, M, mid, TB) >= p * Z
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid + 1)
    return tl.maximum(lo - 1, 0)


@triton.jit
def _grow_band(hrow, frow, NT, fmax, jb, CAP, TB: tl.constexpr, GROW: tl.constexpr):
    """[Ja, Jc] from [Jb, Jb]: add the neighbour bin with fewer tokens while the band's count
    stays <= CAP (at most GROW steps). Returns (Ja, Jc, count, Jb alone fits)."""
    n, _ = _count2(hrow, frow, NT, fmax, jb, jb, TB)
    fits = n <= CAP
    ja = jb
    jc = jb
    more = fits
    steps = tl.zeros([], tl.int32)
    while more & (steps < GROW):
        ca, cc = _count2(hrow, frow, NT, fmax, ja - 1, jc + 1, TB)
        ca = tl.where(ja > 0, ca, CAP + 1.0)
        cc = tl.where(jc < J_END - 1, cc, CAP + 1.0)
        take_a = (n + ca <= CAP) & ((ca <= cc) | (n + cc > CAP))
        take_c = (~take_a) & (n + cc <= CAP)
        ja = tl.where(take_a, ja - 1, ja)
        jc = tl.where(take_c, jc + 1, jc)
        n += tl.where(take_a, ca, tl.where(take_c, cc, 0.0))
        more = take_a | take_c
        steps += 1
    return ja, jc, n, fits


@triton.jit(do_not_specialize=["topp_s"])
def _band_plan_kernel(NT, CAP, tok_ptr, topp_ptr, topp_s, bf_ptr, bi_ptr, hb_ptr, ft_ptr,
                      off_ptr, wf_ptr, TOPP_T: tl.constexpr, NT_P2: tl.constexpr, TB: tl.constexpr,
                      GROW: tl.constexpr):
    """Grid (B,). For a row the merge flagged (token -3): M and Z from the blocks (as the
    merge), then its [NT, 128] counts and F_t
    (about 9 + GROW times, from L1 / L2) and writes the band [Ja, Jc], its count and the
    per-block offsets (exclusive cumsum of the blocks' band counts, block order); no logits.
    The band fails (the row pass in the finish) when Jb alone holds more than CAP tokens or the
    row's Fmax is not finite."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(tok_ptr + row) == BAND_ROW:
        p = _param(topp_ptr, topp_s, row, TOPP_T)
        tt = tl.arange(0, NT_P2)
        _m_t, M, Z = _row_mz(wf_ptr + row * NF * NT, NT, tt, tt < NT)  # as the merge has them
        hrow = hb_ptr + row * NT * NBIN
        frow = ft_ptr + row * NT
        f_t = tl.load(frow + tt, mask=tt < NT, other=float("-inf"))
        fmax = tl.max(f_t, axis=0)
        # one past the largest row bin of a block with a finite token: the bisection's range
        # (~140 bins on flat rows, 8 steps, instead of J_END's 14)
        hi = tl.max(tl.where(f_t > float("-inf"), _band_shift(fmax, f_t), 0), axis=0) + NBIN
        jb = _boundary_bin(hrow, frow, NT, fmax, M, Z, p, tl.minimum(hi, J_END), TB)
        ja, jc, n, ok = _grow_band(hrow, frow, NT, fmax, jb, CAP, TB, GROW)
        ok = ok & (fmax < float("inf")) & (fmax > float("-inf"))
        carry = tl.zeros([], tl.int32)
        for t0 in range(0, NT, TB):
            h, J, _sh = _bins_chunk(hrow, frow, NT, t0, fmax, TB)
            bc = tl.sum(tl.where((J >= ja) & (J <= jc), h, 0.0), axis=1).to(tl.int32)
            tb = t0 + tl.arange(0, TB)
            tl.store(off_ptr + row * NT + tb, carry + tl.cumsum(bc, 0) - bc, mask=tb < NT)
            carry += tl.sum(bc, axis=0)
        tl.store(bf_ptr + row * NBF + B_M, M)
        tl.store(bf_ptr + row * NBF + B_Z, Z)
        tl.store(bf_ptr + row * NBF + B_FMAX, fmax)
        tl.store(bi_ptr + row * NBI + I_OK, ok.to(tl.int32))
        tl.store(bi_ptr + row * NBI + I_JA, ja)
        tl.store(bi_ptr + row * NBI + I_JC, jc)
        tl.store(bi_ptr + row * NBI + I_N, carry)


@triton.jit
def _band_block(lrow, erow, brow, xrow, gf, gi, xs_ptr, is_ptr, base, off_t, F, NT, t, V,
                rep, pres, freq, tdiv, M, fmax, ja, jc, minp, k0, k1, CAP,
                TILE: tl.constexpr, E_BLOCK: tl.constexpr, HAS_REP: tl.constexpr,
                HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Block t of a band row (module docstring): its partials, and its band tokens appended at
    its offset in block order (rank = the lane's order among the block's band tokens)."""
    offs, inb, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                                          TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                                          lrow, 0.0, 0.0, 0.0, False, False)
    x = xp / tdiv
    e = tl.exp(x - M)
    fin = inb & (x > float("-inf")) & (x < float("inf"))
    J = _band_bin(xp, F, BAND_S / tdiv) + _band_shift(fmax, F)
    above = fin & (J < ja)
    band = fin & (J >= ja) & (J <= jc)
    kept = above & (e >= minp)
    score = tl.where(kept, (x - M) + _gumbel(k0, k1, offs), float("-inf"))
    ib = tl.argmax(score, 0, tie_break_left=True)
    hit = tl.arange(0, TILE) == ib
    tl.store(gf + G_WA * NT + t, tl.sum(tl.where(above, e, 0.0), axis=0))
    tl.store(gf + G_WK * NT + t, tl.sum(tl.where(kept, e, 0.0), axis=0))
    tl.store(gf + G_S * NT + t, tl.max(score, axis=0))
    tl.store(gf + G_X * NT + t, tl.max(tl.where(hit, x, float("-inf")), axis=0))
    tl.store(gf + G_AMIN * NT + t, tl.min(tl.where(above, x, float("inf")), axis=0))
    tl.store(gf + G_BMAX * NT + t, tl.max(tl.where(fin & (J > jc), x, float("-inf")), axis=0))
    tl.store(gi + t, (t * TILE + ib).to(tl.int32))
    pos = off_t + tl.cumsum(band.to(tl.int32), 0) - 1
    sel = band & (pos < CAP)  # by construction always (the plan counted the same bins)
    tl.store(xs_ptr + base + pos, x, mask=sel)
    tl.store(is_ptr + base + pos, offs, mask=sel)


@triton.jit(do_not_specialize=["TPC", "stride_lb", "seed_s", "off_s"])
def _band_gather_kernel(
    logits_ptr, stride_lb, V, NT, TPC, CAP,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s,
    tok_ptr, bf_ptr, bi_ptr, ft_ptr, boff_ptr, gf_ptr, gi_ptr, xs_ptr, is_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
):
    """Grid (B, C), program (row, c) owns blocks [c TPC, (c + 1) TPC) like stage 1. For a band
    row whose plan succeeded: reads each of those blocks once (V s bytes per row in all, + its
    history edits), writes 7 words per block and 8 bytes per band token; other rows read only
    their token (and the plan's flag)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if tl.load(tok_ptr + row) == BAND_ROW:
        if tl.load(bi_ptr + row * NBI + I_OK) != 0:
            T, rep, pres, freq, tdiv = _row_scale(
                temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
                TEMP_T, REP_T, PRES_T, FREQ_T)
            minp = tl.zeros([], tl.float32)
            if HAS_MINP:
                minp = _param(minp_ptr, minp_s, row, MINP_T)
            M = tl.load(bf_ptr + row * NBF + B_M)
            fmax = tl.load(bf_ptr + row * NBF + B_FMAX)
            ja = tl.load(bi_ptr + row * NBI + I_JA)
            jc = tl.load(bi_ptr + row * NBI + I_JC)
            k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
            lrow = logits_ptr + row * stride_lb
            for t in range(c * TPC, tl.minimum(c * TPC + TPC, NT)):
                _band_block(lrow, edits_ptr + row * stride_eb, bnd_ptr + row * 2 * NT,
                            x_ptr + row * stride_xb, gf_ptr + row * NG * NT, gi_ptr + row * NT,
                            xs_ptr, is_ptr, row * CAP, tl.load(boff_ptr + row * NT + t),
                            tl.load(ft_ptr + row * NT + t), NT, t, V, rep, pres, freq, tdiv, M,
                            fmax, ja, jc, minp, k0, k1, CAP, TILE, E_BLOCK, HAS_REP, HAS_PF,
                            HAS_MASK, HAS_BIAS)


@triton.jit
def _band_draw(xs_ptr, is_ptr, base, n, M, tau, minp, k0, k1, z_f, best, bidx, bx,
               CB: tl.constexpr):
    """The band list's kept lanes (x >= tau, e >= min_p) into (Z_f, best score, token, its x):
    Gumbel noise by id, the lowest id on an exact score tie."""
    for b0 in range(0, n, CB):
        idx = b0 + tl.arange(0, CB)
        ok = idx < n
        x = tl.load(xs_ptr + base + idx, mask=ok, other=float("-inf"))
        ids = tl.load(is_ptr + base + idx, mask=ok, other=0)
        e = tl.exp(x - M)
        keep = ok & (x >= tau) & (e >= minp)
        z_f += tl.sum(tl.where(keep, e, 0.0), axis=0)
        score = tl.where(keep, (x - M) + _gumbel(k0, k1, ids), float("-inf"))
        tb = tl.max(score, axis=0)
        tid = tl.min(tl.where(keep & (score == tb), ids, 2147483647), axis=0)
        upd = (tb > best) | ((tb == best) & (tb > float("-inf")) & (tid < bidx))
        bidx = tl.where(upd, tid.to(tl.int64), bidx)
        bx = tl.where(upd, tl.max(tl.where(keep & (ids == tid), x, float("-inf")), axis=0), bx)
        best = tl.maximum(best, tb)
    return z_f, best, bidx, bx


@triton.jit
def _band_mass(xs_ptr, base, n, M, CB: tl.constexpr):
    """(sum e^(x - M), min x, max x) over the band list (per-lane sums, then one tree: a fixed
    order)."""
    w = tl.zeros([CB], tl.float32)
    lo = tl.full([CB], float("inf"), tl.float32)
    hi = tl.full([CB], float("-inf"), tl.float32)
    for b0 in range(0, n, CB):
        idx = b0 + tl.arange(0, CB)
        x = tl.load(xs_ptr + base + idx, mask=idx < n, other=float("-inf"))
        w += tl.exp(x - M)
        lo = tl.minimum(lo, tl.where(idx < n, x, float("inf")))
        hi = tl.maximum(hi, x)
    return tl.sum(w, axis=0), tl.min(lo, axis=0), tl.max(hi, axis=0)


@triton.jit
def _band_result(gf, gi, bi, xs_ptr, is_ptr, base, NT, M, Z, p, minp, k0, k1,
                 NT_P2: tl.constexpr, CB: tl.constexpr, NPIV: tl.constexpr,
                 MAX_ROUNDS: tl.constexpr):
    """The validated band answer (module docstring): (ok, Z_f, token, its x)."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    wa = tl.sum(tl.load(gf + G_WA * NT + tt, mask=tin, other=0.0), axis=0)
    z_f = tl.sum(tl.load(gf + G_WK * NT + tt, mask=tin, other=0.0), axis=0)
    amin = tl.min(tl.load(gf + G_AMIN * NT + tt, mask=tin, other=float("inf")), axis=0)
    bmax = tl.max(tl.load(gf + G_BMAX * NT + tt, mask=tin, other=float("-inf")), axis=0)
    s_t = tl.load(gf + G_S * NT + tt, mask=tin, other=float("-inf"))
    id_t = tl.load(gi + tt, mask=tin, other=0)
    best = tl.max(s_t, axis=0)
    bidx = tl.min(tl.where(tin & (s_t == best), id_t, 2147483647), axis=0).to(tl.int64)
    bx = tl.max(tl.where(tin & (s_t == best) & (id_t == bidx),
                         tl.load(gf + G_X * NT + tt, mask=tin, other=float("-inf")),
                         float("-inf")), axis=0)
    bidx = tl.where(best > float("-inf"), bidx, -1)
    n = tl.load(bi + I_N)
    wb, lo, hi = _band_mass(xs_ptr, base, n, M, CB)
    target = p * Z - wa
    ok = (target > 0.0) & (wb >= target)
    tau = lo
    if ok:
        # pivots in (min, max] of the band (a data value, like the merge's M): none wasted
        # above it
        tau, _ = _cand_search(xs_ptr, base, n, M, lo, hi, wb, target, False, CB, NPIV,
                              MAX_ROUNDS)
        ok = (tau > bmax) & (tau <= amin)
    if ok:
        z_f, best, bidx, bx = _band_draw(xs_ptr, is_ptr, base, n, M, tau, minp, k0, k1, z_f,
                                         best, bidx, bx, CB)
    return ok, z_f, bidx, bx


@triton.jit
def _row_lmin(wfrow, NT, NT_P2: tl.constexpr):
    """The row's min finite x (the row search's lower bracket), from stage 1's blocks."""
    tt = tl.arange(0, NT_P2)
    return tl.min(tl.load(wfrow + F_LO * NT + tt, mask=tt < NT, other=float("inf")), axis=0)


@triton.jit(do_not_specialize=["stride_lb", "topp_s", "seed_s", "off_s"])
def _band_finish_kernel(
    logits_ptr, stride_lb, V, NT, CAP,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    topp_ptr, topp_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
    tok_ptr, logp_ptr, bf_ptr, bi_ptr, gf_ptr, gi_ptr, xs_ptr, is_ptr, wf_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    TOPP_T: tl.constexpr, MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr, NT_P2: tl.constexpr,
    CB: tl.constexpr, NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr,
):
    """Grid (B,). For a band row: 7 words per block and the band list (once to sum, once per
    search round, once to draw: from L2), then its token and logprob; no logits unless the band
    failed, when it runs merge.py's _row_pass (a pass per search round + the draw pass)."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(tok_ptr + row) == BAND_ROW:
        T, rep, pres, freq, tdiv = _row_scale(
            temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
            TEMP_T, REP_T, PRES_T, FREQ_T)
        p = _param(topp_ptr, topp_s, row, TOPP_T)
        minp = tl.zeros([], tl.float32)
        if HAS_MINP:
            minp = _param(minp_ptr, minp_s, row, MINP_T)
        M = tl.load(bf_ptr + row * NBF + B_M)
        Z = tl.load(bf_ptr + row * NBF + B_Z)
        k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
        ok = tl.load(bi_ptr + row * NBI + I_OK) != 0
        z_f = tl.zeros([], tl.float32)
        bidx = row * 0 - 1
        bx = tl.zeros([], tl.float32)
        if ok:
            ok, z_f, bidx, bx = _band_result(gf_ptr + row * NG * NT, gi_ptr + row * NT,
                                             bi_ptr + row * NBI, xs_ptr, is_ptr, row * CAP, NT,
                                             M, Z, p, minp, k0, k1, NT_P2, CB, NPIV, MAX_ROUNDS)
        if ~ok:
            lrow = logits_ptr + row * stride_lb
            no = tl.zeros([], tl.int1)
            _, _, z_f, _, bidx, bx = _row_pass(
                lrow, edits_ptr + row * stride_eb, bnd_ptr + row * 2 * NT, x_ptr + row * stride_xb,
                lrow, NT, V, rep, pres, freq, tdiv, M, Z, _row_lmin(wf_ptr + row * NF * NT, NT, NT_P2),
                row * 0, p, minp, no, ~no, no, M, M * 0.0, M * 0.0, M * 0.0, k0, k1, M * 0.0,
                tl.full([], float("-inf"), tl.float32), row * 0 - 1, M * 0.0, TILE, E_BLOCK,
                NPIV, MAX_ROUNDS, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, False, False)
        tl.store(tok_ptr + row, bidx)
        tl.store(logp_ptr + row, (bx - M) - tl.log(z_f))
