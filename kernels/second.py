"""The second read, spread over the grid: rows the merge could not finish from the candidates.

v2 ran the exact fallback inside the merge program, one program per row; here a row whose kept
set needs no threshold search (min-p alone, or pure temperature whose Gumbel winner the block
partials did not prove) is finished by one launch after the merge:

    _gather_kernel   grid (B, C)   reads the row's blocks once more, with the row's M known:
                                   per block the exact draw partial of its kept tokens; the
                                   row's last program (a ticket: one acq_rel atomic) reduces
                                   the block partials in block order: token, logprob (or Z_f
                                   for the distribution)
    _finish_kernel   grid (B,)     that reduction in a launch of its own, where the gather's
                                   copy would spill (presence / frequency penalties) or a
                                   row state is kept beside the band read's finish

Math per block t (x = fl(xp / T), M the row's max, kept = finite x with x - M >= ln min_p):
    zf_t = sum_{kept} e^(x - M)       best_t = max_{kept} fl(fl(x - M) + G_i), lowest id on ties
Then Z_f = sum_t zf_t (a fixed tree over block indices), token = the best_t's token with the
lowest id among equal scores, logprob = x_tok - M - log Z_f: the row pass of the fallback, in
the same arithmetic per token, so the same token; Z_f is summed per block, so it is the same for
any chunk count and batch. A row without min-p keeps every finite x: it takes the merge's Z
(stage 1's partials) for Z_f, the normaliser such a row has on every path (the merge's proof,
list and row pass), so its logprob is one value whichever path its noise sends it down. Rows
the merge finished read only their token (or Z_f) here. The merge marks a handed-over row in
its own outputs (token -2, or Z_f -1 with WRITE_PROBS) and writes its plan (M, Me, Z or -1, S)
to rf; the launcher runs both launches only when a row of the call can have min-p without
top-k / top-p.

The screened draw (twentieth session; common.py, "the draw's screen"). The winner's score is
Gumbel with location ln W_kept, and the merge knows a W <= W_kept: Z for a pure row (all of it
is kept), for min-p the blocks' partials' bound (merge._kept_mass_bound: a block whose largest
unstored x reaches the cut keeps its ncand candidates, each >= it). It stores S = ln W - 3 in
the plan; with SCREEN (the launcher's choice, as the band gather's: more programs than SMs) a
block computes its tokens' noise (two logs a token) only where a kept token passes the screen,
and the finish checks the winner against S: below it, the finish program re-draws the row
unscreened (_finish_row: one pass over the row; probability <= 1.9e-9), so every answer is the
unscreened one whatever the noise. Flat min-p rows score ~35-55% of their 1024-token blocks
(the bound is loose by the candidates' share of the kept set).

Passes over the logits: 1 (stage 1) + 1 (gather) for these rows; both launches are (B, C)
(+ 1 in the finish, one program, for a row re-drawn there).

Who reads what (_row_share): where only n < B rows take a gather (rows handed over here, band
rows in kernels/band.py), they share all B C programs of its grid, P // n a row, each a
contiguous run of blocks, instead of their own C while the rest of the grid idles: a mixed
batch at B = 64, V = 128256 with 13 band rows reads 2 blocks a program instead of 8. The merge
counts such rows (one relaxed atomic add a row, after its flag; stage 1 resets the counts);
with n = B or 0 program (row, c) keeps stage 1's blocks of its own row. Band rows share in row
order, from the rows' flags (the count only picks the path); rows handed over here in the
order of the merge's list of them (each at the slot its count's atomic returned), since the
gather's last program of a row overwrites the row's flag with its token while other programs
may still be starting. Every output is per block, so no split changes a bit.
"""
import triton
import triton.language as tl

from .band_plan import BAND_ROW
from .common import (_add, _add_max, _better, _gumbel_of, _hash32, _mass_of, _param, _quotient,
                     _penalised_tile, _row_key, _row_scale, _screen_scale, _screened)

# row plan the merge writes for every row handed over (float32 [B, 4]: M, Me, Z where the row
# keeps every finite x (no min-p) else -1, and S, the draw's screen bound, common.py; the
# hand-over itself is flagged in the merge's outputs: token
# -2, or Z_f -1 for the distribution); block partials the gather
# writes (float32 [B, 3, NT], int32 [B, 1, NT])
R_M, R_ME, R_Z, R_S = (tl.constexpr(i) for i in range(4))
NR = tl.constexpr(4)
HANDED = tl.constexpr(-2)
Q_ZF, Q_S, Q_X = (tl.constexpr(i) for i in range(3))
NQ = tl.constexpr(3)
Q_ID = tl.constexpr(0)
NQI = tl.constexpr(1)
# which rows a gather serves (_row_share): band rows (token -3), rows handed over here (token -2),
# or handed over in a distribution call (Z_f -1); the rows' flags are read RB at a time
BUSY_BAND, BUSY_HANDED, BUSY_HANDED_ZF = (tl.constexpr(i) for i in range(3))
SHARE_RB = tl.constexpr(128)
# the merge's counts of them (int32 [NSHARE]; stage 1 resets them, the merge adds one a row),
# then, where the band gather spread over the grid, its count of band rows and the rows in
# slot order (int32 [1 + B], for the band finish: _listed_share), the merge's list of the rows
# it handed over (int32 [B], _handed_list) and the gather's tickets (int32 [B]: a row's gather
# programs that are done, _ticket; stage 1 resets them)
SHARE_BAND, SHARE_HANDED, SHARE_N, SHARE_LIST = (tl.constexpr(i) for i in range(4))
NSHARE = tl.constexpr(2)


@triton.jit
def _takes(tok_ptr, sf_ptr, r, rin, MODE: tl.constexpr, S_ZF: tl.constexpr, NS: tl.constexpr):
    """Does row r (a scalar or a vector, rin its mask) take the read MODE?"""
    if MODE == BUSY_HANDED_ZF:
        busy = tl.load(sf_ptr + r * NS + S_ZF, mask=rin, other=0.0) < 0.0
    else:
        flag = tl.load(tok_ptr + r, mask=rin, other=0)
        if MODE == BUSY_BAND:
            busy = flag == BAND_ROW
        else:
            busy = flag == HANDED
    return busy & rin


@triton.jit
def _busy_rows(tok_ptr, sf_ptr, r0, B, MODE: tl.constexpr, S_ZF: tl.constexpr, NS: tl.constexpr):
    """Rows [r0, r0 + SHARE_RB) that take the read MODE (False past the batch), as int32."""
    r = r0 + tl.arange(0, SHARE_RB)
    return _takes(tok_ptr, sf_ptr, r, r < B, MODE, S_ZF, NS).to(tl.int32)


@triton.jit
def _row_share(tok_ptr, sf_ptr, cnt_ptr, NT, TPC, MODE: tl.constexpr, S_ZF: tl.constexpr,
               NS: tl.constexpr, LIST: tl.constexpr = False):
    """This program's share of a gather (module docstring): (it has one, the row, its blocks
    [t0, t1)). With every row or none taking the read (the merge's count), program (row, c)
    keeps stage 1's blocks of its own row (one load, beside its own flag's); with some, the
    busy rows' cp programs each split their row's blocks: band rows from the flags themselves
    (_spread), rows handed over from the merge's list of them (_spread_handed: the gather's
    last program of a row writes its token, the flag, while other programs may still be
    starting). With LIST (the band gather) a spread also records the busy rows in slot order
    and their number, for the band finish's share (_listed_share: the finish writes the rows'
    tokens, so it cannot read their flags while other programs run). Also returns cp, the
    programs that share the row (its gather's ticket count)."""
    ok = _takes(tok_ptr, sf_ptr, tl.program_id(0), tl.program_id(0) >= 0, MODE, S_ZF, NS)
    row = tl.program_id(0)
    j = tl.program_id(1)
    tpc = TPC
    cp = tl.num_programs(1)
    if _spread_on(cnt_ptr, MODE):
        if MODE == BUSY_BAND:
            ok, row, slot, j, cp, n = _spread(tok_ptr, sf_ptr, MODE, S_ZF, NS)
        else:
            ok, row, slot, j, cp, n = _spread_handed(cnt_ptr)
        tpc = (NT + cp - 1) // cp
        if LIST:
            tl.store(cnt_ptr + SHARE_LIST + slot, row, mask=ok & (j == 0))
            tl.store(cnt_ptr + SHARE_N, n, mask=(slot == 0) & (j == 0))
    t0 = j * tpc
    return ok, row.to(tl.int64), t0, tl.minimum(t0 + tpc, NT), cp


@triton.jit
def _spread_on(cnt_ptr, MODE: tl.constexpr):
    """Do only some rows (not all, not none) take the read MODE, by the merge's count?"""
    n = tl.load(cnt_ptr + (SHARE_BAND if MODE == BUSY_BAND else SHARE_HANDED))
    return (n > 0) & (n < tl.num_programs(0))


@triton.jit
def _listed_share(tok_ptr, cnt_ptr, FP: tl.constexpr):
    """The band finish's share, grid (B, F): (a band row's program, the row, its slice s, the
    row's slices fs). Program (row, s) of its own band row (fs = F) unless the band gather
    spread (second read of only some rows): then the n rows it listed get cp = B F // n
    programs each, in slot order, fs = min(FP, cp) of them slices."""
    ok = tl.load(tok_ptr + tl.program_id(0)) == BAND_ROW
    row = tl.program_id(0)
    s = tl.program_id(1)
    cp = tl.num_programs(1)
    if _spread_on(cnt_ptr, BUSY_BAND):
        n = tl.load(cnt_ptr + SHARE_N)
        cp = (tl.num_programs(0) * cp) // tl.maximum(n, 1)
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        slot = pid // cp
        s = pid % cp
        ok = slot < n
        row = tl.load(cnt_ptr + SHARE_LIST + slot, mask=ok, other=0)
    return ok, row.to(tl.int64), s, tl.minimum(cp, FP)


@triton.jit
def _spread(tok_ptr, sf_ptr, MODE: tl.constexpr, S_ZF: tl.constexpr, NS: tl.constexpr):
    """The n < B busy rows (MODE) share the grid's P = B C programs, cp = P // n a row (>= C),
    in row order (program pid = row C + c is the row's j-th, j = pid % cp); n and the rows
    come from the B flags (L2), read once (twice past SHARE_RB rows: a count, then the row).
    Returns (pid has a row, the row, its slot, j, cp, n)."""
    B = tl.num_programs(0)
    C = tl.num_programs(1)
    pid = tl.program_id(0) * C + tl.program_id(1)
    r = tl.arange(0, SHARE_RB)
    if B <= SHARE_RB:
        busy = _busy_rows(tok_ptr, sf_ptr, 0, B, MODE, S_ZF, NS)
        incl = tl.cumsum(busy, 0)
        n = tl.sum(busy, axis=0)
        cp = (B * C) // tl.maximum(n, 1)
        slot = pid // cp
        # the slot-th busy row: the number of rows whose inclusive busy count is <= slot
        row = tl.sum(((incl <= slot) & (r < B)).to(tl.int32), axis=0)
    else:
        n = tl.zeros([], tl.int32)
        for r0 in range(0, B, SHARE_RB):
            n += tl.sum(_busy_rows(tok_ptr, sf_ptr, r0, B, MODE, S_ZF, NS), axis=0)
        cp = (B * C) // tl.maximum(n, 1)
        slot = pid // cp
        row = tl.zeros([], tl.int32)
        seen = tl.zeros([], tl.int32)
        for r0 in range(0, B, SHARE_RB):
            busy = _busy_rows(tok_ptr, sf_ptr, r0, B, MODE, S_ZF, NS)
            incl = seen + tl.cumsum(busy, 0)
            row += tl.sum(((incl <= slot) & (r0 + r < B)).to(tl.int32), axis=0)
            seen += tl.sum(busy, axis=0)
    return slot < n, row, slot, pid % cp, cp, n


@triton.jit
def _spread_handed(cnt_ptr):
    """_spread for the rows the merge handed over, from its count n and its list of them
    (_handed_list, in the order its atomics gave them slots: which program reads which block
    changes from call to call, no output does). Returns (pid has a row, the row, its slot, j,
    cp, n)."""
    B = tl.num_programs(0)
    C = tl.num_programs(1)
    pid = tl.program_id(0) * C + tl.program_id(1)
    n = tl.load(cnt_ptr + SHARE_HANDED)
    cp = (B * C) // tl.maximum(n, 1)
    slot = pid // cp
    ok = slot < n
    row = tl.load(_handed_list(cnt_ptr) + slot, mask=ok, other=0)
    return ok, row, slot, pid % cp, cp, n


@triton.jit
def _handed_list(cnt_ptr):
    """The merge's list of the rows it handed over (int32 [B] in the counts, a grid (B, *)):
    after the band gather's list."""
    return cnt_ptr + SHARE_LIST + tl.num_programs(0)


@triton.jit
def _handed(tok_ptr, sf_ptr, row, S_ZF: tl.constexpr, NS: tl.constexpr,
            WRITE_PROBS: tl.constexpr):
    """Did the merge hand this row over (token -2, or Z_f -1 for the distribution)?"""
    return _takes(tok_ptr, sf_ptr, row, row >= 0, BUSY_HANDED_ZF if WRITE_PROBS else BUSY_HANDED,
                  S_ZF, NS)


@triton.jit
def _gather_block(lrow, erow, brow, xrow, arow, qf, qi, NT, t, V, rep, pres, freq, tdiv, M,
                  lminp, la, beta, me, k0, k1, ks, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
                  HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                  HAS_BIAS: tl.constexpr, CD: tl.constexpr, SCREEN: tl.constexpr,
                  FUSE: tl.constexpr = True):
    """Block t's draw partial over its kept tokens (module docstring); with SCREEN the draw
    over those that can reach the merge's bound S only (common._screened; none: -inf, lane 0,
    -inf), which the finish checks."""
    offs, inb, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                                          TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                                          arow, la, beta, me, CD, False)
    x = _quotient(xp, tdiv)
    e = _mass_of(x, M)
    kept = inb & (x > float("-inf")) & (x - M >= lminp)
    a = _hash32(k0, k1, offs)
    cand = _screened(kept, a, e, ks, SCREEN)
    s_b = tl.full([], float("-inf"), tl.float32)
    i_b = tl.zeros([], tl.int32)
    x_b = tl.full([], float("-inf"), tl.float32)
    # the kept mass and whether any lane can score in one reduction (one cross-warp exchange),
    # or in two (FUSE off: the band gather's launch with both hand-overs spilled 104 bytes at
    # its 80 cap); the same tree for the sum either way
    scores = True
    if FUSE:
        zf, nc = tl.reduce((tl.where(kept, e, 0.0), cand.to(tl.int32)), 0, _add_max)
        if SCREEN:
            scores = nc > 0
    else:
        zf = tl.reduce(tl.where(kept, e, 0.0), 0, _add)
        if SCREEN:
            scores = tl.max(cand.to(tl.int32), axis=0) > 0
    if scores:
        score = tl.where(cand, (x - M) + _gumbel_of(a), float("-inf"))
        # the winner, its lane and its x in one reduction (the draw's rule; unscreened, lane 0
        # if none is kept)
        s_b, i_b, x_b = tl.reduce((score, tl.arange(0, TILE), x), 0, _better)
    tl.store(qf + Q_ZF * NT + t, zf)
    tl.store(qf + Q_S * NT + t, s_b)
    tl.store(qf + Q_X * NT + t, x_b)
    tl.store(qi + Q_ID * NT + t, (t * TILE + i_b).to(tl.int32))


@triton.jit(do_not_specialize=["TPC", "stride_lb", "stride_ab", "seed_s", "off_s"])
def _gather_kernel(
    logits_ptr, stride_lb, V, NT, TPC, cnt_ptr,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s,
    rf_ptr, tok_ptr, sf_ptr, qf_ptr, qi_ptr, logp_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TILE: tl.constexpr, E_BLOCK: tl.constexpr,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr, WRITE_PROBS: tl.constexpr,
    S_ZF: tl.constexpr, NS: tl.constexpr, SCREEN: tl.constexpr = False,
    FINISH: tl.constexpr = False, S_TAU: tl.constexpr = 0, STATE: tl.constexpr = False,
    NT_P2: tl.constexpr = 2,
):
    """Grid (B, C); the rows the merge handed over share its programs (_row_share). Each reads
    its blocks once (V * s bytes per row in all, + V * s_a with CD, + its history edits) and
    writes 4 words per block; every program reads the merge's count and its row's flag (token,
    or Z_f), and the B flags where only some rows were handed over. With SCREEN (the
    launcher's choice, as the band gather's) the draw is screened against the merge's S.
    With FINISH the row's last program finishes it (_finish_handed, _finish_kernel's work: one
    launch fewer): a CTA barrier, then one acq_rel atomic on the row's ticket (_ticket, reset
    by stage 1); the program that takes ticket cp - 1 of the row's cp is its last."""
    ok, row, t0, t1, cp = _row_share(tok_ptr, sf_ptr, cnt_ptr, NT, TPC,
                                     BUSY_HANDED_ZF if WRITE_PROBS else BUSY_HANDED, S_ZF, NS)
    if ok:
        _gather_program(row, t0, t1, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr,
                        x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s,
                        freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
                        rf_ptr, qf_ptr, qi_ptr, am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
                        TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T, OFF_T, HAS_MINP, HAS_REP,
                        HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK, LA_T, BETA_T, CD,
                        SCREEN and not WRITE_PROBS)
        if FINISH:
            # every store of this program is released before the ticket, every other
            # program's is visible after it (acq_rel), as the band finish's slices do
            tl.debug_barrier()
            if tl.atomic_add(_ticket(cnt_ptr, row), 1, sem="acq_rel") == cp - 1:
                _finish_handed(row, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb,
                               bnd_ptr, x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s,
                               pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr,
                               seed_s, off_ptr, off_s, rf_ptr, qf_ptr, qi_ptr, tok_ptr,
                               logp_ptr, sf_ptr, am_ptr, stride_ab, la_ptr, la_s, beta_ptr,
                               beta_s, TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T, OFF_T,
                               HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK,
                               LA_T, BETA_T, CD, S_TAU, S_ZF, NS, WRITE_PROBS, NT_P2, STATE)


@triton.jit
def _ticket(cnt_ptr, row):
    """Row ``row``'s gather ticket in the counts (int32 [SHARE_LIST + 3 B]), in a grid (B, *):
    after the merge's list of rows handed over."""
    return cnt_ptr + SHARE_LIST + 2 * tl.num_programs(0) + row


@triton.jit
def _gather_program(
    row, t0, t1, logits_ptr, stride_lb, V, NT,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s,
    rf_ptr, qf_ptr, qi_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TILE: tl.constexpr, E_BLOCK: tl.constexpr,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr, SCREEN: tl.constexpr,
    FUSE: tl.constexpr = True,
):
    """Blocks [t0, t1) of a handed-over row (its share, _row_share) in _gather_kernel; also run
    by kernels/band.py's gather when a launch has both hand-overs (one launch for both second
    reads, sampling._launch_band), and by the finishes over a whole row, unscreened, where the
    screened winner fell below S (_finish_row)."""
    if t0 < t1:
        T, rep, pres, freq, tdiv = _row_scale(
            temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
            TEMP_T, REP_T, PRES_T, FREQ_T)
        lminp = tl.full([], float("-inf"), tl.float32)
        if HAS_MINP:
            lminp = _param(minp_ptr, minp_s, row, MINP_T)
        la = _param(la_ptr, la_s, row, LA_T)
        beta = _param(beta_ptr, beta_s, row, BETA_T)
        M = tl.load(rf_ptr + row * NR + R_M)
        me = tl.load(rf_ptr + row * NR + R_ME)
        ks = float("inf")
        if SCREEN:
            ks = _screen_scale(tl.load(rf_ptr + row * NR + R_S))
        k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
        lrow = logits_ptr + row * stride_lb
        arow = am_ptr + row * stride_ab
        erow = edits_ptr + row * stride_eb
        brow = bnd_ptr + row * 2 * NT
        xrow = x_ptr + row * stride_xb
        qf = qf_ptr + row * NQ * NT
        qi = qi_ptr + row * NQI * NT
        for t in range(t0, t1):
            _gather_block(lrow, erow, brow, xrow, arow, qf, qi, NT, t, V, rep, pres, freq, tdiv, M,
                          lminp, la, beta, me, k0, k1, ks, TILE, E_BLOCK, HAS_REP, HAS_PF,
                          HAS_MASK, HAS_BIAS, CD, SCREEN, FUSE)


@triton.jit(do_not_specialize=["stride_lb", "stride_ab", "seed_s", "off_s"])
def _finish_kernel(
    logits_ptr, stride_lb, V, NT,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s,
    rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr, sf_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr,
    S_TAU: tl.constexpr, S_ZF: tl.constexpr, NS: tl.constexpr,
    WRITE_PROBS: tl.constexpr, NT_P2: tl.constexpr, STATE: tl.constexpr,
):
    """Grid (B,). For a handed-over row: reads its 4 words per block (no logits) and writes the
    token and logprob, or, with WRITE_PROBS, Z_f and tau for _write_probs_kernel (with STATE
    both: the merge's row state made whole for kernels/topn.py). A winner below the screen's
    bound S re-draws the row here, unscreened (_finish_row: the gather's arguments are for
    that; probability <= 1.9e-9 a row). The gather does this itself where it takes FINISH."""
    row = tl.program_id(0).to(tl.int64)
    if _handed(tok_ptr, sf_ptr, row, S_ZF, NS, WRITE_PROBS):
        _finish_handed(row, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr, x_ptr,
                       stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr,
                       freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s, rf_ptr,
                       qf_ptr, qi_ptr, tok_ptr, logp_ptr, sf_ptr, am_ptr, stride_ab, la_ptr,
                       la_s, beta_ptr, beta_s, TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T,
                       OFF_T, HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK,
                       LA_T, BETA_T, CD, S_TAU, S_ZF, NS, WRITE_PROBS, NT_P2, STATE)


@triton.jit
def _finish_handed(
    row, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s, rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr, sf_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr,
    S_TAU: tl.constexpr, S_ZF: tl.constexpr, NS: tl.constexpr,
    WRITE_PROBS: tl.constexpr, NT_P2: tl.constexpr, STATE: tl.constexpr,
):
    """A handed-over row's finish from its 4 words per block: Z_f, then the token and logprob
    (_finish_row), or, with WRITE_PROBS, Z_f and tau for _write_probs_kernel (with STATE both:
    the merge's row state made whole for kernels/topn.py)."""
    z_f = _kept_mass(qf_ptr, rf_ptr, row, NT, NT_P2)
    if WRITE_PROBS or STATE:
        tl.store(sf_ptr + row * NS + S_ZF, z_f)
        tl.store(sf_ptr + row * NS + S_TAU, float("-inf"))  # every finite x, as a list row
    if not WRITE_PROBS:
        _finish_row(row, z_f, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr,
                    x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s,
                    freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
                    rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr, am_ptr, stride_ab, la_ptr,
                    la_s, beta_ptr, beta_s, TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T,
                    OFF_T, HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK,
                    LA_T, BETA_T, CD, NT_P2)


@triton.jit
def _kept_mass(qf_ptr, rf_ptr, row, NT, NT_P2: tl.constexpr):
    """A handed-over row's kept mass: the merge's Z where the row keeps every finite x
    (R_Z > 0), else Z_f, its blocks' masses summed in block order."""
    tt = tl.arange(0, NT_P2)
    z_f = tl.sum(tl.load(qf_ptr + row * NQ * NT + Q_ZF * NT + tt, mask=tt < NT, other=0.0),
                 axis=0)
    z = tl.load(rf_ptr + row * NR + R_Z)
    return tl.where(z > 0.0, z, z_f)


@triton.jit
def _finish_best(NT, qf, qi, NT_P2: tl.constexpr):
    """The row's winner from its block partials: (best score, its token: the lowest id on
    ties, its x)."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    # one reduction by the draw's rule (a chain of three before); padding loses every tie
    return tl.reduce((tl.load(qf + Q_S * NT + tt, mask=tin, other=float("-inf")),
                      tl.load(qi + Q_ID * NT + tt, mask=tin, other=2147483647),
                      tl.load(qf + Q_X * NT + tt, mask=tin, other=float("-inf"))), 0, _better)


@triton.jit
def _finish_row(
    row, z_f, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s, rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr, NT_P2: tl.constexpr,
):
    """A handed-over row's token and logprob (z_f: its kept mass, summed in block order). Every
    kept token the gather's screen skipped scores below the merge's S, so a winner >= S is the
    unscreened draw's; below S, this program rewrites the row's partials unscreened (a pass
    over the row) and takes their winner: the same answer for any noise."""
    qf = qf_ptr + row * NQ * NT
    qi = qi_ptr + row * NQI * NT
    best, bid, bx = _finish_best(NT, qf, qi, NT_P2)
    if best < tl.load(rf_ptr + row * NR + R_S):
        # make sure the blocks' loads above are done before their words are rewritten
        tl.debug_barrier()
        _gather_program(row, 0, NT, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr,
                        x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s,
                        freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
                        rf_ptr, qf_ptr, qi_ptr, am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
                        TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T, OFF_T, HAS_MINP, HAS_REP,
                        HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK, LA_T, BETA_T, CD, False)
        # the rewritten words were stored by other threads of this program
        tl.debug_barrier()
        best, bid, bx = _finish_best(NT, qf, qi, NT_P2)
    tl.store(tok_ptr + row, bid.to(tl.int64))
    tl.store(logp_ptr + row, (bx - tl.load(rf_ptr + row * NR + R_M)) - tl.log(z_f))


@triton.jit
def _finish_sampled(
    logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, minp_ptr, minp_s,
    seed_ptr, seed_s, off_ptr, off_s, rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr,
    TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    MINP_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr, NT_P2: tl.constexpr,
):
    """_finish_kernel's work in kernels/band.py's finish (one launch finishes both hand-overs):
    program (row, 0) finishes its row if the merge handed it over, in a sampling call (no
    distribution, no row state, no contrastive decoding)."""
    row = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        if tl.load(tok_ptr + row) == HANDED:
            z_f = _kept_mass(qf_ptr, rf_ptr, row, NT, NT_P2)
            _finish_row(row, z_f, logits_ptr, stride_lb, V, NT, edits_ptr, stride_eb, bnd_ptr,
                        x_ptr, stride_xb, temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s,
                        freq_ptr, freq_s, minp_ptr, minp_s, seed_ptr, seed_s, off_ptr, off_s,
                        rf_ptr, qf_ptr, qi_ptr, tok_ptr, logp_ptr, logits_ptr, 0, logits_ptr,
                        0.0, logits_ptr, 0.0, TEMP_T, REP_T, PRES_T, FREQ_T, MINP_T, SEED_T,
                        OFF_T, HAS_MINP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE, E_BLOCK,
                        False, False, False, NT_P2)
