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
                                      best Gumbel score of the tokens above the band (scored
                                      only where one can reach the plan's bound S, below), the
                                      smallest x above it and the largest x below it; the
                                      band's tokens (x, id) appended at the block's offset;
                                      after its blocks, each program adds its tokens'
                                      fixed-point masses to the row's bucket table (read back
                                      from the list: ~5% of a flat row's lanes)
    _band_finish_kernel  grid (B, FP) tau's bucket from the table; each program filters 1 / FP
                                      of the band list (bucket-b tokens, the draw above b); the
                                      row's last program (an atomic ticket) searches tau on the
                                      bucket's tokens, draws, writes the logprob; a row that
                                      fails takes merge.py's row pass there (same answer)

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

Finish (thirteenth session: the bucket table). The gather adds each band token's mass, as an
integer e 2^47 (exact, order-free sums), into the row's table of NBUCK buckets of 1/QR unit of
x (band_plan.py; a monotone function of x, so equal x share a bucket). With target = p Z - W_a,
tau's bucket b is the highest whose suffix mass reaches target (one int64 scan: W_a < p Z <=
W_a + W_band, tau lies in the band, or the row fails), A = the mass above it. The list is
split over FP programs (one wave of the batch); each copies its bucket-b tokens to scratch at
its slice's start and keeps, per lane, the kept mass (fixed point) and the best draw of its
tokens above b; then a ticket (bar.sync, one acq_rel atomic: the stores are released before
it), and the row's last program gathers the slices' bucket-b tokens into one list in slice
order, runs the pivot rounds there (W(t) = A + their mass of x >= t, ~10-30 tokens on a flat
row), checks max x below < tau <= min x above (no tie group of x straddles a band edge) and
draws: the best of the blocks' above-winners, the slices' winners and bucket b's kept tokens
(Gumbel noise by id, lowest id on ties), Z_f = W_a,kept + the slices' kept mass + bucket b's,
logprob = x_tok - M - log Z_f. Every sum is per block, fixed point, or over the list in list
order, so the result is the same for any chunk count, batch and FP.

The screened draw (nineteenth session). The row's winner max over the kept set of
(x - M) + G is Gumbel-distributed with location ln W_kept >= ln(p Z), so it lies below
S = ln(p Z) - 3 (band_plan._band_screen_bound) with probability <= exp(-e^3) = 1.9e-9. A token can
score >= S only if E = -ln(1 - w) <= e^(x - M - S) (G = -ln E), and E >= w: the gather tests
w <= e ks (ks = e^(2^-7 - S), the slack covering the test's fp32 roundings) on every lane
after the hash (on its bits: one multiply, one compare; common._screened) and scores
exactly (two logs and the winner's reduction) only in a block where some kept lane passes:
~e^3 / p = 21 tokens a row pass, so ~15% of a flat row's 1024-token blocks. The finish checks
the row's winner against S and runs the row pass below it, so every answer is the unscreened
one, bit for bit. No screen with min-p
(its cut can keep less than p Z): S = -inf, ks = +inf. The finish's slices screen their draw
over the band list's tokens above bucket b the same way (twentieth session; a tile scores only
where a kept lane passes), at any batch: the band tokens sit at tau, far below the top, so
few pass.

Passes over the logits for these rows: 1 (stage 1) + 1 (gather), both over (B, C); a failed row
pays the row pass on top (its gather is skipped when the plan already failed). Bytes besides:
260 per block (stage 1's estimate, written once, read twice by the plan), 28 per block (gather
partials), 8 per band token (written once, read once by the finish's slices; its x read back
once by the gather's table pass, from L1 / L2) and an 8-byte atomic add each, the 8 KB table
(reset by the plan, read by each finish program), 8 bytes per bucket-b token (copied twice,
then read once a round and by the draw).
"""
import triton
import triton.language as tl

from .band_plan import (B_FMAX, B_M, B_SLB, B_Z, FX, I_JA, I_JC, I_N, I_OK, I_TICK, NBF, NBI,
                        NBUCK, Q_SLACK, QR)
from .common import (BAND_S, NO_ID, _add2, _band_bin, _band_scale, _band_shift, _better,
                     _edges_combine,
                     _edges_mass_combine, _gumbel, _gumbel_of, _hash32, _kept_slots,
                     _mass_of, _maxmin_combine, _param, _penalised_tile, _pivot_update, _pivots,
                     _quotient, _row_key, _row_scale, _screen_scale, _screened)
from .merge import _row_pass
from .second import (BUSY_BAND, BUSY_HANDED, _finish_sampled, _gather_program,
                     _listed_share, _row_share)
from .stats import F_LO, NF

# the gather's per-block partials (float32 [B, NG, NT], int32 [B, NT]: the above-winner's id)
G_WA, G_WK, G_S, G_X, G_AMIN, G_BMAX = (tl.constexpr(i) for i in range(6))
NG = tl.constexpr(6)


@triton.jit
def _bucket(x, fmax, jc):
    """A band token's bucket (band_plan.py's table): floor(x QR) - qb clamped to [0, NBUCK), a
    monotone function of x (equal x, one bucket; the clamp keeps it monotone), the same float
    arithmetic in the gather and the finish."""
    qb = tl.floor((fmax - jc.to(tl.float32)) * (1.0 / BAND_S) * QR) - Q_SLACK
    d = tl.floor(x * QR) - qb
    return tl.minimum(tl.maximum(d, 0.0), NBUCK - 1).to(tl.int32)


@triton.jit
def _screened_winner(x, a, cand, M, scores, TILE: tl.constexpr):
    """The block's best draw (score (x - M) + G, its lane, its x; the draw's rule; a the lanes'
    hash bits) over the lanes cand (_screened), or (-inf, 0, -inf) when scores is false (no
    lane passed)."""
    s_b = tl.full([], float("-inf"), tl.float32)
    i_b = tl.zeros([], tl.int32)
    x_b = tl.full([], float("-inf"), tl.float32)
    if scores:
        score = tl.where(cand, (x - M) + _gumbel_of(a), float("-inf"))
        # the winner, its lane and its x in one reduction (the draw's rule; unscreened, lane 0
        # if none is kept)
        s_b, i_b, x_b = tl.reduce((score, tl.arange(0, TILE), x), 0, _better)
    return s_b, i_b, x_b


@triton.jit
def _band_block(lrow, erow, brow, xrow, gf, gi, tab, xs_ptr, is_ptr, base, orow, F, NT, t, V,
                rep, pres, freq, tdiv, M, fmax, ja, jc, lminp, k0, k1, ks, CAP,
                TILE: tl.constexpr, E_BLOCK: tl.constexpr, HAS_MINP: tl.constexpr,
                HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                HAS_BIAS: tl.constexpr, R: tl.constexpr, SCREEN: tl.constexpr):
    """Block t of a band row (module docstring): its partials, its band tokens appended at
    its offset orow[t] in block order (rank = the lane's order among the block's band
    tokens); the program adds them into the row's bucket table afterwards (_band_table)."""
    offs, inb, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                                          TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                                          lrow, 0.0, 0.0, 0.0, False, False)
    x = _quotient(xp, tdiv)
    e = _mass_of(x, M)
    fin = inb & (x > float("-inf")) & (x < float("inf"))
    J = _band_bin(xp, F, _band_scale(tdiv)) + _band_shift(fmax, F)
    above = fin & (J < ja)
    band = fin & (J >= ja) & (J <= jc)
    # without min-p the kept lanes are the lanes above (e >= 0 on every finite x): their mass
    # is one sum, not two (the compiler cannot prove e >= 0)
    kept = above
    if HAS_MINP:
        kept = above & (x - M >= lminp)
    a = _hash32(k0, k1, offs)
    cand = _screened(kept, a, e, ks, SCREEN)
    # min x above, max x below, the screen's count and the mass above: one reduction
    lo = tl.where(above, x, float("inf"))
    hi = tl.where(fin & (J > jc), x, float("-inf"))
    wl = tl.where(above, e, 0.0)
    if SCREEN:
        amin, bmax, nc, wa = tl.reduce((lo, hi, cand.to(tl.int32), wl), 0, _edges_combine)
        s_b, i_b, x_b = _screened_winner(x, a, cand, M, nc > 0, TILE)
    else:
        s_b, i_b, x_b = _screened_winner(x, a, cand, M, True, TILE)
        amin, bmax, wa = tl.reduce((lo, hi, wl), 0, _edges_mass_combine)
    wk = wa
    if HAS_MINP:
        wk = tl.sum(tl.where(kept, e, 0.0), axis=0)
    tl.store(gf + G_WA * NT + t, wa)
    tl.store(gf + G_WK * NT + t, wk)
    tl.store(gf + G_S * NT + t, s_b)
    tl.store(gf + G_X * NT + t, x_b)
    tl.store(gf + G_AMIN * NT + t, amin)
    tl.store(gf + G_BMAX * NT + t, bmax)
    tl.store(gi + t, (t * TILE + i_b).to(tl.int32))
    off_t = tl.load(orow + t)
    pos = off_t + _kept_slots(band, TILE, R)
    sel = band & (pos < CAP)  # by construction always (the plan counted the same bins)
    tl.store(xs_ptr + base + pos, x, mask=sel)
    tl.store(is_ptr + base + pos, offs, mask=sel)


@triton.jit
def _band_table(xrow, i0, i1, tab, M, fmax, jc, R: tl.constexpr):
    """The band tokens a program appended, list entries [i0, i1), added into the row's bucket
    table: e 2^47 by integer atomics (the same sums in any order). Read back from the list, R
    a step, after the program's blocks (a flat row's block holds ~60 of its 1024 lanes)
    rather than on each block's TILE lanes, where every lane paid the bucket, the address and
    the atomic: the same x, so the same e and the same integers. Its own loop after the block
    loop: inside it, the step spilled under the 64-register cap."""
    for b0 in range(i0, i1, R):
        j = b0 + tl.arange(0, R)
        ok = j < i1
        x = tl.load(xrow + j, mask=ok, other=0.0)
        tl.atomic_add(tab + _bucket(x, fmax, jc), (tl.exp(x - M) * FX).to(tl.int64), mask=ok,
                      sem="relaxed")


@triton.jit(do_not_specialize=["TPC", "stride_lb", "seed_s", "off_s"])
def _band_gather_kernel(
    logits_ptr, stride_lb, V, NT, TPC, CAP, cnt_ptr,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s,
    tok_ptr, bf_ptr, bi_ptr, ft_ptr, boff_ptr, tab_ptr, gf_ptr, gi_ptr, xs_ptr, is_ptr,
    rf_ptr, qf_ptr, qi_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr, R: tl.constexpr,
    SECOND: tl.constexpr = False, SCREEN: tl.constexpr = False,
):
    """Grid (B, C); the band rows share its programs (second._row_share: with every row a band
    row, program (row, c) owns stage 1's blocks). For a band row whose plan succeeded: reads
    each of its blocks once (V s bytes per row in all, + its history edits), writes 7 words per
    block and 8 bytes per band token; every program reads the merge's count and its own row's
    token, and the B tokens where only some rows are band rows. With SECOND (a
    launch that also has the second read, kernels/second.py) it is that read's gather too: the
    rows the merge handed over there (token -2) share the grid the same way and run
    second._gather_program, one launch fewer (rf, qf, qi: its plan and block partials; dummies
    otherwise). With SCREEN (the launcher's choice: more than one program per SM) the draw is
    screened against the plan's bound S (_screened_winner); without it every block scores,
    as one block a program is then the launch's critical path and the screen's test and
    reduction would lengthen it."""
    if SECOND:
        ok, row, t0, t1, _ = _row_share(tok_ptr, tok_ptr, cnt_ptr, NT, TPC, BUSY_HANDED, 0, 1)
        if ok:
            _gather_program(row, t0, t1, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb,
                            bnd_ptr, x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr,
                            pres_s, freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr,
                            off_s, rf_ptr, qf_ptr, qi_ptr, logits_ptr, 0, logits_ptr, 0.0,
                            logits_ptr, 0.0, TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T, OFF_T,
                            HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK, False,
                            False, False, SCREEN, False)
    ok, row, t0, t1, _ = _row_share(tok_ptr, tok_ptr, cnt_ptr, NT, TPC, BUSY_BAND, 0, 1,
                                    True)
    if ok:
        if tl.load(bi_ptr + row * NBI + I_OK) != 0:
            T, rep, pres, freq, tdiv = _row_scale(
                temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
                TEMP_T, REP_T, PRES_T, FREQ_T)
            lminp = tl.full([], float("-inf"), tl.float32)
            if HAS_MINP:
                lminp = _param(minp_ptr, minp_s, row, MINP_T)
            M = tl.load(bf_ptr + row * NBF + B_M)
            fmax = tl.load(bf_ptr + row * NBF + B_FMAX)
            ja = tl.load(bi_ptr + row * NBI + I_JA)
            jc = tl.load(bi_ptr + row * NBI + I_JC)
            k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
            ks = tl.zeros([], tl.float32)
            if SCREEN:
                ks = _screen_scale(tl.load(bf_ptr + row * NBF + B_SLB))
            lrow = logits_ptr + row * stride_lb
            for t in range(t0, t1):
                _band_block(lrow, edits_ptr + row * stride_eb, bnd_ptr + row * 2 * NT,
                            x_ptr + row * stride_xb, gf_ptr + row * NG * NT, gi_ptr + row * NT,
                            tab_ptr + row * NBUCK, xs_ptr, is_ptr, row * CAP,
                            boff_ptr + row * NT,
                            tl.load(ft_ptr + row * NT + t), NT, t, V, rep, pres, freq, tdiv, M,
                            fmax, ja, jc, lminp, k0, k1, ks, CAP, TILE, E_BLOCK, HAS_MINP,
                            HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, R, SCREEN)
            if t0 < t1:
                # the list's entries were stored by the lanes that held them, read back by
                # others; [t0, t1)'s tokens are list entries [boff[t0], boff[t1]) (boff[NT] = n)
                tl.debug_barrier()
                i1 = tl.load(boff_ptr + row * NT + t1, mask=t1 < NT,
                             other=tl.load(bi_ptr + row * NBI + I_N))
                _band_table(xs_ptr + row * CAP, tl.load(boff_ptr + row * NT + t0), i1,
                            tab_ptr + row * NBUCK, M, fmax, jc, R)


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
    over the lanes (a fixed order), the best as _best_lane."""
    best, bidx, bx = _best_lane(sl, il, xl, best, bidx, bx)
    return z_f + tl.sum(zl, axis=0), best, bidx, bx


@triton.jit
def _best_lane(sl, il, xl, best, bidx, bx):
    """Fold per-lane winners (score, id, x) into (best score, token, its x): the best score
    with the lowest id on ties, in one reduction (the draw's rule, common._better, as the
    combine: ids are distinct but for empty lanes, which share x)."""
    tb, tid, tx = tl.reduce((sl, il, xl), 0, _better)
    upd = (tb > best) | ((tb == best) & (tb > float("-inf")) & (tid < bidx))
    return tl.maximum(best, tb), tl.where(upd, tid.to(tl.int64), bidx), tl.where(upd, tx, bx)


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
    # the three in one reduction: one cross-warp exchange
    nxt, prv, mass = tl.reduce((nxt, prv, mass), 0, _edges_mass_combine)
    return mass, nxt, prv


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
def _bucket_pick(tab, target):
    """From the row's bucket table: b = the highest bucket whose suffix mass (buckets >= b)
    reaches target (in fixed point: target rounded up), -1 if the band's whole mass does not;
    and the mass A of the buckets above b (< target: tau lies in bucket b). Integer sums:
    exact and order-free. A (the suffix at b less bucket b) comes out of the same reduction
    as b; with b = -1 the row fails and A is not used."""
    q = tl.arange(0, NBUCK)
    m = tl.load(tab + q)
    tq = tl.ceil(target * FX).to(tl.int64)
    suf = tl.cumsum(m, 0, reverse=True)
    b, a = tl.reduce((tl.where(suf >= tq, q, -1), suf - m), 0, _last_bucket)
    return b, a.to(tl.float32) * (1.0 / FX)


@triton.jit
def _last_bucket(q1, a1, q2, a2):
    """(the larger bucket, its value) as a reduction (buckets are distinct but for -1)."""
    first = q1 >= q2
    return tl.where(first, q1, q2), tl.where(first, a1, a2)


@triton.jit
def _band_filter(xs_ptr, is_ptr, base, i0, i1, sx_ptr, si_ptr, fmax, jc, b, M, lminp, k0, k1, ks,
                 CB: tl.constexpr):
    """One finish program's slice [i0, i1) of the band list: its tokens in bucket b (where tau
    is) copied to (sx, si) from i0 on in list order, their min and max x, and the draw over
    the buckets above b (all kept but for min-p): per lane their kept mass (fixed point, e 2^47:
    integer sums, the same for any slicing) and the best score (Gumbel noise by id, the lower
    id on a tie) with its id and x, reduced once at the end (_draw_reduce). The draw is
    screened as the gather's (_screened_winner, factor ks): a tile scores (two logs a lane)
    only where a kept lane can reach the plan's bound S, which the row's last program checks
    the winner against. Returns (count, min, max, kept mass, best, id, x)."""
    m = tl.zeros([], tl.int32)
    lo = tl.full([CB], float("inf"), tl.float32)
    hi = tl.full([CB], float("-inf"), tl.float32)
    zq = tl.zeros([CB], tl.int64)
    _, sl, il, xl = _draw_init(CB)
    ok, x, ids = _list_tile(xs_ptr, is_ptr, base, i0, i1, CB)
    for b0 in range(i0, i1, CB):
        # the next tile's loads in flight while this one is filtered (the row's one program
        # waits on each at B >= 2 SMs' worth of rows)
        ok_n, x_n, ids_n = _list_tile(xs_ptr, is_ptr, base, b0 + CB, i1, CB)
        q = _bucket(x, fmax, jc)
        sel = ok & (q == b)
        pos = i0 + m + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(sx_ptr + base + pos, x, mask=sel)
        tl.store(si_ptr + base + pos, ids, mask=sel)
        lo = tl.minimum(lo, tl.where(sel, x, float("inf")))
        hi = tl.maximum(hi, tl.where(sel, x, float("-inf")))
        e = tl.exp(x - M)
        keep = ok & (q > b) & (x - M >= lminp)
        zq += tl.where(keep, (e * FX).to(tl.int64), 0)
        a = _hash32(k0, k1, ids)
        cand = _screened(keep, a, e, ks, True)
        # the tile's bucket-b count and its screened lanes in one reduction
        nsel, ncand = tl.reduce((sel.to(tl.int32), cand.to(tl.int32)), 0, _add2)
        m += nsel
        if ncand > 0:
            score = (x - M) + _gumbel_of(a)
            upd = cand & ((score > sl) | ((score == sl) & (ids < il)))
            sl, il, xl = tl.where(upd, score, sl), tl.where(upd, ids, il), tl.where(upd, x, xl)
        ok, x, ids = ok_n, x_n, ids_n
    best, bidx, bx = _best_lane(sl, il, xl, float("-inf"), NO_ID, tl.zeros([], tl.float32))
    hi, lo = tl.reduce((hi, lo), 0, _maxmin_combine)
    return m, lo, hi, tl.sum(zq, axis=0), best, bidx, bx


@triton.jit
def _list_tile(xs_ptr, is_ptr, base, b0, i1, CB: tl.constexpr):
    """List entries [b0, b0 + CB) below i1: (mask, x, id)."""
    idx = b0 + tl.arange(0, CB)
    ok = idx < i1
    return (ok, tl.load(xs_ptr + base + idx, mask=ok, other=float("-inf")),
            tl.load(is_ptr + base + idx, mask=ok, other=0))


@triton.jit
def _band_draw(xs_ptr, is_ptr, base, n, M, tau, lminp, k0, k1, z_f, best, bidx, bx,
               CB: tl.constexpr):
    """The band list's kept lanes (x >= tau, x - M >= ln min_p) into (Z_f, best score, token,
    its x), with the gather's above-winner as the start."""
    zl, sl, il, xl = _draw_init(CB)
    for b0 in range(0, n, CB):
        ok, x, ids = _list_tile(xs_ptr, is_ptr, base, b0, n, CB)
        keep = ok & (x >= tau) & (x - M >= lminp)
        zl, sl, il, xl = _draw_lanes(x, ids, keep, M, k0, k1, zl, sl, il, xl)
    return _draw_reduce(zl, sl, il, xl, z_f, best, bidx, bx)


@triton.jit
def _better_maxmin(s1, i1, x1, m1, l1, s2, i2, x2, m2, l2):
    """common._better on (score, id, x) and (max, min) of two more operands: one reduction."""
    s, i, x = _better(s1, i1, x1, s2, i2, x2)
    return s, i, x, tl.maximum(m1, m2), tl.minimum(l1, l2)


@triton.jit
def _above_winner(gf, gi, NT, NT_P2: tl.constexpr):
    """The gather's per-block partials of the tokens above the band: (their kept mass, min x
    above, max x below, best score, its token, its x), blocks in index order."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    z_f = tl.sum(tl.load(gf + G_WK * NT + tt, mask=tin, other=0.0), axis=0)
    # max x below, min x above and the blocks' best draw in one reduction (the last program
    # of the row waits on each); padding ids lose every tie
    best, bidx, bx, bmax, amin = tl.reduce(
        (tl.load(gf + G_S * NT + tt, mask=tin, other=float("-inf")),
         tl.load(gi + tt, mask=tin, other=2147483647),
         tl.load(gf + G_X * NT + tt, mask=tin, other=float("-inf")),
         tl.load(gf + G_BMAX * NT + tt, mask=tin, other=float("-inf")),
         tl.load(gf + G_AMIN * NT + tt, mask=tin, other=float("inf"))), 0, _better_maxmin)
    return z_f, amin, bmax, best, tl.where(best > float("-inf"), bidx.to(tl.int64), -1), bx


# a finish slice's partials (float32 [B, NSP, FP], int64 [B, 3, FP]): its bucket-b tokens' min
# and max x, the best draw of its slice's buckets above b (score, x; id) and their kept mass
# (fixed point), its bucket-b token count
S_LO, S_HI, S_S, S_X = (tl.constexpr(i) for i in range(4))
NSP = tl.constexpr(4)
SI_ID, SI_N, SI_Z = (tl.constexpr(i) for i in range(3))
NSPI = tl.constexpr(3)


@triton.jit
def _above_mass(gf, NT, NT_P2: tl.constexpr):
    """W_above: the blocks' masses above the band, in block order (one tree, the same in every
    finish program)."""
    tt = tl.arange(0, NT_P2)
    return tl.sum(tl.load(gf + G_WA * NT + tt, mask=tt < NT, other=0.0), axis=0)


@triton.jit
def _band_slice(gf, bi, tab, xs_ptr, is_ptr, sx_ptr, si_ptr, sp, spi, base, s, fs, NT, M, Z,
                p, lminp, k0, k1, ks, fmax, NT_P2: tl.constexpr, CB: tl.constexpr,
                FP: tl.constexpr):
    """Finish program s of a band row's fs (<= FP): tau's bucket b from the table (each program
    the same), then _band_filter over its 1 / fs of the band list; its partials to (sp, spi).
    Returns (target, b, A) for the row's last program (the same in every program)."""
    target = p * Z - _above_mass(gf, NT, NT_P2)
    b, A = _bucket_pick(tab, target)
    n = tl.load(bi + I_N)
    sl = (n + fs - 1) // fs
    i0 = tl.minimum(s * sl, n)
    m, lo, hi, z, best, bidx, bx = _band_filter(xs_ptr, is_ptr, base, i0, tl.minimum(i0 + sl, n),
                                                sx_ptr, si_ptr, fmax, tl.load(bi + I_JC), b, M,
                                                lminp, k0, k1, ks, CB)
    tl.store(sp + S_LO * FP + s, lo)
    tl.store(sp + S_HI * FP + s, hi)
    tl.store(sp + S_S * FP + s, best)
    tl.store(sp + S_X * FP + s, bx)
    tl.store(spi + SI_ID * FP + s, bidx.to(tl.int64))
    tl.store(spi + SI_N * FP + s, m.to(tl.int64))
    tl.store(spi + SI_Z * FP + s, z)
    return target, b, A


@triton.jit
def _band_gather_survivors(xs_ptr, is_ptr, sx_ptr, si_ptr, base, n, cnt, fs,
                           FP: tl.constexpr, SEG: tl.constexpr):
    """The fs slices' bucket-b tokens (slice s's at its own start, cnt[s] of them, 0 past fs)
    copied into one list at base, in slice order: [FP, SEG] tiles, one for buckets of <= SEG
    a slice."""
    sl = (n + fs - 1) // fs
    s = tl.arange(0, FP)
    j = tl.arange(0, SEG)
    dst = (tl.cumsum(cnt, 0) - cnt)[:, None] + j[None, :]
    src = base + (tl.minimum(s * sl, n))[:, None] + j[None, :]
    for j0 in range(0, tl.max(cnt, axis=0), SEG):
        ok = (j0 + j)[None, :] < cnt[:, None]
        x = tl.load(sx_ptr + src + j0, mask=ok, cache_modifier=".cg")
        ids = tl.load(si_ptr + src + j0, mask=ok, cache_modifier=".cg")
        tl.store(xs_ptr + base + dst + j0, x, mask=ok)
        tl.store(is_ptr + base + dst + j0, ids, mask=ok)


@triton.jit
def _band_result(gf, gi, bi, xs_ptr, is_ptr, sx_ptr, si_ptr, sp, spi, base, fs, NT, M, target,
                 b, A, lminp, slb, k0, k1, NT_P2: tl.constexpr, SB2: tl.constexpr,
                 NPIV2: tl.constexpr, MAX_ROUNDS: tl.constexpr, FP: tl.constexpr,
                 SEG: tl.constexpr):
    """The row's last finish program: the fs slices' partials (fixed order), their bucket-b
    tokens gathered into one list, tau on it, the draw; validated (module docstring), the
    winner's score against the gather's screen bound slb included. Takes its own slice's
    (target, b, A): every program computed the same. Returns (ok, Z_f, token, its x)."""
    z_f, amin, bmax, best, bidx, bx = _above_winner(gf, gi, NT, NT_P2)
    s = tl.arange(0, FP)
    sm = s < fs
    cnt = tl.load(spi + SI_N * FP + s, mask=sm, other=0, cache_modifier=".cg").to(tl.int32)
    m = tl.sum(cnt, axis=0)
    ok = (target > 0.0) & (b >= 0) & (m > 0)
    if ok:
        _band_gather_survivors(xs_ptr, is_ptr, sx_ptr, si_ptr, base, tl.load(bi + I_N), cnt, fs,
                               FP, SEG)
        # the list was stored in [FP, SEG] tiles and the search loads it in SB2 tiles: other
        # threads' stores must land first (without this bar.sync a warp read stale entries on
        # an H200, and the row fell back to the row pass: other logprob bits, run to run)
        tl.debug_barrier()
        pv, lo = tl.reduce((tl.load(sp + S_HI * FP + s, mask=sm, other=float("-inf"),
                                    cache_modifier=".cg"),
                            tl.load(sp + S_LO * FP + s, mask=sm, other=float("inf"),
                                    cache_modifier=".cg")), 0, _maxmin_combine)
        lo, pv = _band_search(xs_ptr, base, m, M, A, lo, pv, target, SB2, NPIV2, MAX_ROUNDS)
        ok = (lo >= pv) & (lo > bmax) & (lo <= amin)  # tau = lo; no tie straddles an edge
        if ok:
            ss = tl.load(sp + S_S * FP + s, mask=sm, other=float("-inf"), cache_modifier=".cg")
            sid = tl.load(spi + SI_ID * FP + s, mask=sm, other=2147483647,
                          cache_modifier=".cg").to(tl.int32)
            ks, kid, kx = _best_lane(ss, sid, tl.load(sp + S_X * FP + s, mask=sm, other=0.0,
                                                      cache_modifier=".cg"), best, bidx, bx)
            kp = tl.sum(tl.load(spi + SI_Z * FP + s, mask=sm, other=0, cache_modifier=".cg"),
                        axis=0)
            kp = kp.to(tl.float32) * (1.0 / FX)
            z_f, best, bidx, bx = _band_draw(xs_ptr, is_ptr, base, m, M, lo, lminp, k0, k1,
                                             z_f + kp, ks, kid, kx, SB2)
            ok = best >= slb  # every token the gather's screen skipped scores < slb
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
    tok_ptr, logp_ptr, bf_ptr, bi_ptr, tab_ptr, gf_ptr, gi_ptr, xs_ptr, is_ptr, sx_ptr, si_ptr,
    sp_ptr, spi_ptr, wf_ptr, rf_ptr, qf_ptr, qi_ptr, cnt_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    TOPP_T: tl.constexpr, MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr, NT_P2: tl.constexpr,
    CB: tl.constexpr, NPIV: tl.constexpr, SB2: tl.constexpr,
    NPIV2: tl.constexpr, MAX_ROUNDS: tl.constexpr, FP: tl.constexpr, SEG: tl.constexpr,
    SECOND: tl.constexpr = False,
):
    """Grid (B, F); a band row's slices are fs = min(FP, cp) of its cp programs (cp = F, or
    more where only some rows are band rows: second._listed_share). For a band row whose plan
    succeeded, slice s: the table (8 KB) and the blocks' above masses, its 1 / fs of the band
    list (8 bytes a token, from L2), 7 words of partials; then a ticket (an acq_rel atomic
    after a CTA barrier: every store of the program is released before it), and the row's last
    program (ticket fs - 1) merges the partials, gathers the bucket-b tokens, searches tau on
    them, draws and writes the token and logprob. No logits unless the band failed, when one
    program runs merge.py's _row_pass (a pass per search round + the draw pass). With SECOND
    program (row, 0) is also the second read's finish (kernels/second.py) for a row the merge
    handed there (token -2; rf, qf, qi: that read's plan and block partials): one launch
    fewer."""
    if SECOND:
        _finish_sampled(logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr, x_ptr,
                        stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr,
                        freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s, rf_ptr,
                        qf_ptr, qi_ptr, tok_ptr, logp_ptr, TEMP_T, REP_T, PRES_T, FREQ_T,
                        MINP_T, SEED_T, OFF_T, HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                        TILE, E_BLOCK, NT_P2)
    busy, row, s, fs = _listed_share(tok_ptr, cnt_ptr, FP)
    if busy & (s < fs):
        T, rep, pres, freq, tdiv = _row_scale(
            temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
            TEMP_T, REP_T, PRES_T, FREQ_T)
        p = _param(topp_ptr, topp_s, row, TOPP_T)
        lminp = tl.full([], float("-inf"), tl.float32)
        if HAS_MINP:
            lminp = _param(minp_ptr, minp_s, row, MINP_T)
        M = tl.load(bf_ptr + row * NBF + B_M)
        Z = tl.load(bf_ptr + row * NBF + B_Z)
        k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
        birow = bi_ptr + row * NBI
        ok = tl.load(birow + I_OK) != 0
        slb = tl.load(bf_ptr + row * NBF + B_SLB)
        last = s == 0
        z_f = tl.zeros([], tl.float32)
        bidx = row * 0 - 1
        bx = tl.zeros([], tl.float32)
        gfrow, sprow = gf_ptr + row * NG * NT, sp_ptr + row * NSP * FP
        spirow = spi_ptr + row * NSPI * FP
        if ok:
            target, b, A = _band_slice(gfrow, birow, tab_ptr + row * NBUCK, xs_ptr, is_ptr,
                                       sx_ptr, si_ptr, sprow, spirow, row * CAP, s, fs, NT, M,
                                       Z, p, lminp, k0, k1, _screen_scale(slb),
                                       tl.load(bf_ptr + row * NBF + B_FMAX), NT_P2, CB, FP)
            tl.debug_barrier()
            last = tl.atomic_add(birow + I_TICK, 1, sem="acq_rel") == fs - 1
            if last:
                ok, z_f, bidx, bx = _band_result(
                    gfrow, gi_ptr + row * NT, birow, xs_ptr, is_ptr, sx_ptr, si_ptr, sprow,
                    spirow, row * CAP, fs, NT, M, target, b, A, lminp, slb, k0, k1, NT_P2, SB2,
                    NPIV2, MAX_ROUNDS, FP, SEG)
        if last:
            if ~ok:
                lrow = logits_ptr + row * stride_lb
                no = tl.zeros([], tl.int1)
                _, _, z_f, _, bidx, bx = _row_pass(
                    lrow, edits_ptr + row * stride_eb, bnd_ptr + row * 2 * NT,
                    x_ptr + row * stride_xb, lrow, NT, V, rep, pres, freq, tdiv, M, Z,
                    _row_lmin(wf_ptr + row * NF * NT, NT, NT_P2), row * 0, p, lminp, no, ~no, no,
                    M, M * 0.0, M * 0.0, M * 0.0, seed_ptr, seed_s, off_ptr, off_s, row,
                    M * 0.0, tl.full([], float("-inf"), tl.float32), row * 0 - 1, M * 0.0, TILE,
                    E_BLOCK, NPIV, MAX_ROUNDS, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, False, False,
                    SEED_T, OFF_T)
            tl.store(tok_ptr + row, bidx)
            tl.store(logp_ptr + row, (bx - M) - tl.log(z_f))
