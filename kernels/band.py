"""The band read: top-p rows (no top-k) whose nucleus outgrew the candidates, in a second read
over the whole grid instead of the merge's row pass (one program, a pass per search round).

Estimate, then validate (kernels/README.md, "v4"; bench/window_sim.py is the float64 study):

    stage 1 (BANDS)      per block t: F_t = floor(vm_t s), s = 8 / T, and an int16 count of its
                         finite tokens per bin j = min(F_t - floor(xp s), 127)
    the merge's plan     per row      (kernels/band_plan.py) row bins J = j + (Fmax - F_t); the
                                      boundary bin Jb from the estimated masses, the band
                                      [Ja, Jc] around it (<= CAP tokens by the counts),
                                      per-block offsets into the list
    _band_gather_kernel  grid (B, C)  the second read: per block the exact mass / min-p mass /
                                      best Gumbel score of the tokens above the band, the
                                      smallest x above it and the largest x below it; the
                                      band's tokens (x, id) appended at the block's offset
    _band_finish_kernel  grid (B,)    validate, search tau on the band, draw, logprob; a row
                                      that fails takes merge.py's row pass here (same answer)

Math (x = fl(xp / T), e = e^(x - M), M and Z as the merge has them). Bin j of block t covers
x ~ [(F_t - j) / 8, (F_t - j + 1) / 8), so its mass is estimated as
count e^((F_t - j) / 8 - M) 8 (e^(1/8) - 1) (a uniform density inside the bin). The plan builds
the row's counts per row bin J < 256 in one pass (gather loads of each block's bins at its
shift), takes the smallest row edge E with Z - W_est(J >= E) >= p Z (one reverse cumsum),
Jb = E - 1, and the band [Jb - a, Jb + c] (a + c <= 16) of <= CAP tokens with the largest
min(a, c), then a + c. Every kernel bins a token with common.py's _band_bin on
the same xp and stage 1's F_t, so the band is a set of bins, the same in all of them: the
counts are exact and the list never overflows. Unclamped, J = Fmax - floor(xp s) whatever the
block, monotone in xp, so above / band / below are upper sets of xp.

Validation (finish): W_a < p Z <= W_a + W_band (tau lies in the band: round 1's -inf pivot), then
tau = pivot rounds with target p Z - W_a (round 1 over the band, the rest over its survivors
[lo, pv] with W(t) = A + their mass, A the mass above pv), and
max x below < tau <= min x above (no tie group of x straddles an edge). Then every kept token
(x >= tau, e >= min_p) is above the band or in it: Z_f = W_a,kept + band kept mass, the token
the best of the blocks' above-winners and the band's kept lanes (Gumbel noise by id, lowest id
on ties), logprob = x_tok - M - log Z_f. Everything is per block or over the list in block
order (fixed trees), so the result is the same for any chunk count and batch.

Passes over the logits for these rows: 1 (stage 1) + 1 (gather), both over (B, C); a failed row
pays the row pass on top (its gather is skipped when the plan already failed). Bytes besides:
260 per block (stage 1's estimate, written once, read twice by the plan), 28 per block (gather
partials), 8 per band token (written once; x read by round 1, the shrink and the draw, ids by
the draw), 4 per survivor (written once, read once a later round).
"""
import triton
import triton.language as tl

from .band_plan import B_FMAX, B_M, B_Z, BAND_ROW, I_JA, I_JC, I_N, I_OK, NBF, NBI
from .common import (BAND_S, _band_bin, _band_shift, _gumbel, _param, _penalised_tile,
                     _pivot_update, _pivots, _row_key, _row_scale)
from .merge import _row_pass
from .second import HANDED, _finish_sampled, _gather_program
from .stats import F_LO, NF

# the gather's per-block partials (float32 [B, NG, NT], int32 [B, NT]: the above-winner's id)
G_WA, G_WK, G_S, G_X, G_AMIN, G_BMAX = (tl.constexpr(i) for i in range(6))
NG = tl.constexpr(6)


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
    rf_ptr, qf_ptr, qi_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
    SECOND: tl.constexpr = False,
):
    """Grid (B, C), program (row, c) owns blocks [c TPC, (c + 1) TPC) like stage 1. For a band
    row whose plan succeeded: reads each of those blocks once (V s bytes per row in all, + its
    history edits), writes 7 words per block and 8 bytes per band token; other rows read only
    their token (and the plan's flag). With SECOND (a launch that also has the second read,
    kernels/second.py) it is that read's gather too: rows the merge handed over there (token
    -2) run second._gather_program here, the same code at the same geometry, one launch fewer
    (rf, qf, qi: its plan and block partials; dummies otherwise)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if SECOND:
        _gather_program(row, c, logits_ptr, stride_lb, V, NT, TPC, edits_ptr, stride_eb, bnd_ptr,
                        x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s,
                        freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
                        rf_ptr, tok_ptr, tok_ptr, qf_ptr, qi_ptr, logits_ptr, 0, logits_ptr,
                        0.0, logits_ptr, 0.0, TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T,
                        OFF_T, HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK,
                        False, False, False, False, 0, 1)
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
def _draw_lanes(x, ids, keep, M, k0, k1, zl, sl, il, xl):
    """Per-lane running Z_f and winner (best score, its id, its x) over kept lanes: Gumbel
    noise by id, the lower id on an exact tie. One CTA reduction at the end (_draw_reduce)
    instead of five per list block."""
    zl += tl.where(keep, tl.exp(x - M), 0.0)
    score = (x - M) + _gumbel(k0, k1, ids)
    upd = keep & ((score > sl) | ((score == sl) & (ids < il)))
    return zl, tl.where(upd, score, sl), tl.where(upd, ids, il), tl.where(upd, x, xl)


@triton.jit
def _draw_reduce(zl, sl, il, xl, z_f, best, bidx, bx):
    """Fold the lanes of _draw_lanes into (Z_f, best score, token, its x): Z_f += one tree
    over the lanes (a fixed order), the best score with the lowest id on ties."""
    tb = tl.max(sl, axis=0)
    tid = tl.min(tl.where(sl == tb, il, 2147483647), axis=0)
    upd = (tb > best) | ((tb == best) & (tb > float("-inf")) & (tid < bidx))
    bidx = tl.where(upd, tid.to(tl.int64), bidx)
    bx = tl.where(upd, tl.max(tl.where((sl == tb) & (il == tid), xl, float("-inf")), axis=0),
                  bx)
    return z_f + tl.sum(zl, axis=0), tl.maximum(best, tb), bidx, bx


@triton.jit
def _draw_init(CB: tl.constexpr):
    return (tl.zeros([CB], tl.float32), tl.full([CB], float("-inf"), tl.float32),
            tl.full([CB], 2147483647, tl.int32), tl.zeros([CB], tl.float32))


@triton.jit
def _pivot_pass(xs_ptr, base, n, M, piv, SB: tl.constexpr, NPIV: tl.constexpr):
    """One pass over a list for NPIV pivots: (mass of x >= t, min x >= t, max x < t) per
    pivot. Each lane keeps its own [NPIV] partials across the list's blocks and the CTA
    reduces them once (merge._cand_search reduces three [CB, NPIV] tensors per block: its
    rounds were 60% of the finish). Mass: per lane in list order, then one tree (fixed)."""
    mass = tl.zeros([SB, NPIV], tl.float32)
    nxt = tl.full([SB, NPIV], float("inf"), tl.float32)
    prv = tl.full([SB, NPIV], float("-inf"), tl.float32)
    for b0 in range(0, n, SB):
        idx = b0 + tl.arange(0, SB)
        x = tl.load(xs_ptr + base + idx, mask=idx < n, other=float("-inf"))
        ge = x[:, None] >= piv[None, :]
        mass += tl.where(ge, tl.exp(x - M)[:, None], 0.0)
        nxt = tl.minimum(nxt, tl.where(ge, x[:, None], float("inf")))
        prv = tl.maximum(prv, tl.where(ge, float("-inf"), x[:, None]))
    return tl.sum(mass, axis=0), tl.min(nxt, axis=0), tl.max(prv, axis=0)


@triton.jit
def _band_search(xs_ptr, base, n, M, A, lo, pv, target, SB: tl.constexpr, NPIV: tl.constexpr,
                 ROUNDS: tl.constexpr):
    """Pivot rounds for tau = max{t : W(t) >= target}, W(t) = A + the list's mass of x >= t
    (needs W(lo) >= target), as merge.py's (common._pivots / _pivot_update: pivots in (lo, pv],
    snapped onto data values). Returns (lo, pv): tau in [lo, pv], both data values."""
    rounds = tl.zeros([], tl.int32)
    while (lo < pv) & (rounds < ROUNDS):
        w, nxt, prv = _pivot_pass(xs_ptr, base, n, M, _pivots(lo, pv, NPIV), SB, NPIV)
        w = A + w
        lo, pv, _ = _pivot_update(w, w, nxt, prv, lo, pv, A, target, NPIV, False)
        rounds += 1
    return lo, pv


@triton.jit
def _band_round1(xs_ptr, base, n, M, fmax, ja, jc, target, SB: tl.constexpr,
                 NPIV: tl.constexpr):
    """The first round over the whole band, with no pass before it: pivots -inf (W = the
    band's mass, snapped to its min), +inf (fails, snapped to its max) and NPIV - 2 evenly
    between the band's bin edges in x, (Fmax - Jc) / 8 and (Fmax - Ja + 1) / 8 (an estimate's
    grid: where they fall only decides how far the round narrows). Returns (tau's bracket
    [lo, pv], tau lies in the band: W_band >= target > 0)."""
    j = tl.arange(0, NPIV)
    xl = (fmax - jc.to(tl.float32)) / BAND_S
    xh = (fmax - ja.to(tl.float32) + 1.0) / BAND_S
    piv = xl + (xh - xl) * j.to(tl.float32) / (NPIV - 1)
    piv = tl.where(j == 0, float("-inf"), tl.where(j == NPIV - 1, float("inf"), piv))
    w, nxt, prv = _pivot_pass(xs_ptr, base, n, M, piv, SB, NPIV)
    ok = (target > 0.0) & (tl.sum(tl.where(j == 0, w, 0.0), axis=0) >= target)
    inf = tl.full([], float("inf"), tl.float32)
    lo, pv, _ = _pivot_update(w, w, nxt, prv, -inf, inf, target, target, NPIV, False)
    return lo, pv, ok


@triton.jit
def _band_shrink(xs_ptr, base, n, sx_ptr, M, lo, pv, CB: tl.constexpr):
    """After round 1 (tau in [lo, pv]): the list's x in [lo, pv] copied to sx in list order,
    and A = the mass of x > pv (per lane, one tree), so the later rounds' W(t) = A + the mass
    of sx >= t scans ~1/NPIV of the band instead of all of it. Returns (count, A)."""
    m = tl.zeros([], tl.int32)
    a = tl.zeros([CB], tl.float32)
    for b0 in range(0, n, CB):
        idx = b0 + tl.arange(0, CB)
        ok = idx < n
        x = tl.load(xs_ptr + base + idx, mask=ok, other=float("-inf"))
        sel = ok & (x >= lo) & (x <= pv)
        pos = m + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(sx_ptr + base + pos, x, mask=sel)
        m += tl.sum(sel.to(tl.int32), axis=0)
        a += tl.where(ok & (x > pv), tl.exp(x - M), 0.0)
    return m, tl.sum(a, axis=0)


@triton.jit
def _band_draw(xs_ptr, is_ptr, base, n, M, tau, minp, k0, k1, z_f, best, bidx, bx,
               CB: tl.constexpr):
    """The band list's kept lanes (x >= tau, e >= min_p) into (Z_f, best score, token, its x),
    with the gather's above-winner as the start."""
    zl, sl, il, xl = _draw_init(CB)
    for b0 in range(0, n, CB):
        idx = b0 + tl.arange(0, CB)
        ok = idx < n
        x = tl.load(xs_ptr + base + idx, mask=ok, other=float("-inf"))
        ids = tl.load(is_ptr + base + idx, mask=ok, other=0)
        keep = ok & (x >= tau) & (tl.exp(x - M) >= minp)
        zl, sl, il, xl = _draw_lanes(x, ids, keep, M, k0, k1, zl, sl, il, xl)
    return _draw_reduce(zl, sl, il, xl, z_f, best, bidx, bx)


@triton.jit
def _above_winner(gf, gi, NT, NT_P2: tl.constexpr):
    """The gather's per-block partials of the tokens above the band: (W_above, their kept
    mass, min x above, max x below, best score, its token, its x), blocks in index order."""
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
    return wa, z_f, amin, bmax, best, tl.where(best > float("-inf"), bidx, -1), bx


@triton.jit
def _band_result(gf, gi, bi, xs_ptr, is_ptr, sx_ptr, base, NT, M, Z, p, minp, k0, k1, fmax,
                 NT_P2: tl.constexpr, CB: tl.constexpr, SB: tl.constexpr, NPIV: tl.constexpr,
                 SB2: tl.constexpr, NPIV2: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    """The validated band answer (module docstring): (ok, Z_f, token, its x). Passes over the
    band list: round 1, the shrink, the draw; the later rounds scan the survivors (sx)."""
    wa, z_f, amin, bmax, best, bidx, bx = _above_winner(gf, gi, NT, NT_P2)
    n = tl.load(bi + I_N)
    target = p * Z - wa
    lo, pv, ok = _band_round1(xs_ptr, base, n, M, fmax, tl.load(bi + I_JA), tl.load(bi + I_JC),
                              target, SB, NPIV)
    if ok:
        m, A = _band_shrink(xs_ptr, base, n, sx_ptr, M, lo, pv, CB)
        lo, pv = _band_search(sx_ptr, base, m, M, A, lo, pv, target, SB2, NPIV2, MAX_ROUNDS - 1)
        ok = (lo > bmax) & (lo <= amin)  # tau = lo; no tie group straddles an edge
        if ok:
            z_f, best, bidx, bx = _band_draw(xs_ptr, is_ptr, base, n, M, lo, minp, k0, k1, z_f,
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
    tok_ptr, logp_ptr, bf_ptr, bi_ptr, gf_ptr, gi_ptr, xs_ptr, is_ptr, sx_ptr, wf_ptr,
    rf_ptr, qf_ptr, qi_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    TOPP_T: tl.constexpr, MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr, NT_P2: tl.constexpr,
    CB: tl.constexpr, SB: tl.constexpr, NPIV: tl.constexpr, SB2: tl.constexpr,
    NPIV2: tl.constexpr, MAX_ROUNDS: tl.constexpr, SECOND: tl.constexpr = False,
):
    """Grid (B,). For a band row: 7 words per block and the band list (once to sum, once per
    search round, once to draw: from L2), then its token and logprob; no logits unless the band
    failed, when it runs merge.py's _row_pass (a pass per search round + the draw pass). With
    SECOND it is also the second read's finish (kernels/second.py) for the rows the merge
    handed there (token -2; rf, qf, qi: that read's plan and block partials): one launch
    fewer."""
    row = tl.program_id(0).to(tl.int64)
    flag = tl.load(tok_ptr + row)
    if SECOND:
        if flag == HANDED:
            _finish_sampled(row, NT, rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr, NT_P2)
    if flag == BAND_ROW:
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
            ok, z_f, bidx, bx = _band_result(
                gf_ptr + row * NG * NT, gi_ptr + row * NT, bi_ptr + row * NBI,
                xs_ptr, is_ptr, sx_ptr, row * CAP, NT, M, Z, p, minp, k0, k1,
                tl.load(bf_ptr + row * NBF + B_FMAX), NT_P2, CB, SB, NPIV, SB2, NPIV2,
                MAX_ROUNDS)
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
