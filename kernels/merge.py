"""Stage 2, one program per row: merge the block partials, find the thresholds on the candidates,
apply min-p, draw with Gumbel-max and compute the logprob. Rows the candidates cannot decide
exactly take an exact fallback over the row (more passes, same program, no host sync).

Math per row, transformers' order (see kernels/README.md):
    M = max_t m_t,  Z = sum_t z_t exp(m_t - M)                    (blocks in index order)
    keep i  iff  x_i >= tau_k,  tau_k = k-th largest x (ties with it kept)
           and  x_i >= tau_p,  tau_p = max{t : sum_{x >= t, x >= tau_k} e^(x-M) >= p * Z_k}
           and  x_i - M >= ln min_p      (its float32, params.log_cut: exact, any backend)
    token = argmax_{kept} (x_i - M + Gumbel_i),  logprob = x_tok - M - log(sum_{kept} e^(x - M))

Exactness: G = max_t g_t bounds every value that is not a candidate. A threshold found on the
candidates is exact when it is > G (everything >= it is a candidate, so its count / mass is the
row's). The kept set then lies inside the candidates. Otherwise (overflow: flat or tie-heavy
rows, huge nuclei, no filter at all, or a row whose x overflows to +inf) the program redoes the
search and the draw over the row itself: passes = 1 per top-k / top-p search round + 1 draw.
With SECOND, rows that need no threshold search (min-p alone; pure temperature whose winner the
block partials did not prove) are instead handed to kernels/second.py: a second read over the
whole grid (B, C), then a (B,) finish; the merge writes their plan (M, Me, lmin) and flags
them in its outputs (token -2; Z_f -1 for the distribution). With BANDS, top-p rows without
top-k that would take the row pass go to kernels/band.py (a band of x around tau estimated from
stage 1's histograms, one more read over (B, C)); the merge flags them with token -3 and plans
their band (kernels/band_plan.py). The row pass itself is ``_row_pass``, which band.py calls for
rows whose band fails validation.
"""
import triton
import triton.language as tl

from .band_plan import BAND_ROW, NBF, NBI, NBUCK, _plan_row
from .second import HANDED, NR, R_M, R_ME, R_S, R_Z, SHARE_BAND, SHARE_HANDED, _handed_list
from .common import (EMPTY_SLOT, LOG2E, NBIN, NO_ID, NS, S_M, S_ME, S_TAU, S_XPMAX, S_ZF,
                     _add_max, _bad_row, _better, _cand_id, _cand_x, _edges_combine, _gumbel,
                     _head, _param, _penalised_tile, _pivot_init, _pivot_partials, _pivot_update,
                     _log2e_scale, _pivots, _pure_row, _quotient, _reciprocal, _row_key,
                     _row_scale, _screen_bound, _tempered)
from .stats import (DRAW_SLACK, F_BX, F_G, F_LO, F_M, F_S2, F_Z, I_BID, I_NCAND, I_NFIN,
                    I_NNAN, I_NPOS, _block_stats, _row_bases)


@triton.jit
def _slot_block(cand_ptr, row, NT, b0, tdiv, ncand_t, KT: tl.constexpr, CB: tl.constexpr,
                NT_P2: tl.constexpr):
    """CB per-block candidate slots from flat slot b0: (candidate mask, x, token ids). Slots
    hold xp (stage 1 works before the temperature); x = xp / T here. Stage 1 writes a block's
    first ncand_t slots only: the rest (and every slot of a block the merge emptied, CD) is
    masked, never read."""
    ok, v = _slot_load(cand_ptr, row, NT, b0, ncand_t, KT, CB, NT_P2)
    return ok, _quotient(_cand_x(v), tdiv), _cand_id(v)


@triton.jit
def _kept_mass_bound(wfrow, NT, tt, tin, m_t, ncand_t, M, lminp):
    """A lower bound on the mass min-p keeps, from the blocks' partials (no candidate read):
    a block whose largest unstored x, g_t, reaches the cut keeps all its ncand_t candidates,
    each >= g_t (they are an upper set of the block); any other keeps at least its max if that
    reaches the cut. Only the screen's bound uses it: its tightness sets how many tokens are
    scored, never an answer."""
    g_t = tl.load(wfrow + F_G * NT + tt, mask=tin, other=float("-inf"))
    eg = tl.exp(g_t - M)
    em = tl.exp(m_t - M)
    w = tl.where(g_t - M >= lminp, ncand_t.to(tl.float32) * eg,
                 tl.where(m_t - M >= lminp, em, 0.0))
    return tl.sum(tl.where(tin, w, 0.0), axis=0)


@triton.jit
def _cand_minp_mass(cand_ptr, row, NT, tdiv, ncand_t, M, lminp, KT: tl.constexpr,
                    CB: tl.constexpr, NT_P2: tl.constexpr):
    """The candidates' mass sum e^(x - M) over those min-p keeps: a lower bound on the
    mass min-p keeps (one pass over the NT KT slots, from L2)."""
    wm = tl.zeros([CB], tl.float32)
    for b0 in range(0, NT * KT, CB):
        ok, x, _ = _slot_block(cand_ptr, row, NT, b0, tdiv, ncand_t, KT, CB, NT_P2)
        e = tl.exp(x - M)
        wm += tl.where(ok & (x - M >= lminp), e, 0.0)
    return tl.sum(wm, axis=0)


@triton.jit
def _cand_mass_bound(m_t, ncand_t, M):
    """An upper bound of the candidates' mass (sum of e^(x - M)): block t's ncand_t candidates
    are each at most its max m_t; 2^-8 over, for the roundings of both sums."""
    return tl.sum(ncand_t.to(tl.float32) * tl.exp(m_t - M), axis=0) * (1.0 + 2.0 ** -8)


@triton.jit
def _slot_load(cand_ptr, row, NT, b0, ncand_t, KT: tl.constexpr, CB: tl.constexpr,
               NT_P2: tl.constexpr):
    """_slot_block's load alone: (candidate mask, packed slots). A loop issues the next
    block's load before it decodes this one, so the L2 latency overlaps the work (one
    program per row waits on every load)."""
    idx = b0 + tl.arange(0, CB)
    nb = tl.gather(ncand_t, tl.minimum(idx // KT, NT_P2 - 1), 0)
    ok = (idx < NT * KT) & (idx % KT < nb)
    return ok, tl.load(cand_ptr + row * NT * KT + idx, mask=ok, other=EMPTY_SLOT)


@triton.jit
def _reached_slots(cand_ptr, row, NT, order, nreach, b0, KT: tl.constexpr,
                   CB: tl.constexpr, NT_P2: tl.constexpr):
    """CB candidate slots from slot b0 of the blocks listed first in ``order`` (nreach of
    them, ascending; each entry block * 2^16 + its candidate count): (candidate mask, packed
    slots), loaded a loop step ahead as _slot_load."""
    lane = b0 + tl.arange(0, CB)
    e = tl.gather(order, tl.minimum(lane // KT, NT_P2 - 1), 0)
    ok = (lane < nreach * KT) & (lane % KT < (e & 0xFFFF))
    slot = (row * NT + (e >> 16).to(tl.int64)) * KT + lane % KT
    return ok, tl.load(cand_ptr + slot, mask=ok, other=EMPTY_SLOT)


@triton.jit
def _reached_order(reach, key, NT_P2: tl.constexpr):
    """key[t] of the reached blocks in block order (entry j: the j-th reached block; entries
    past their count are unused). Rank j's block is the number of blocks whose inclusive
    count of reached blocks is <= j: a binary search over that count, log2(NT_P2) gathers
    (tl.sort of the keys, a bitonic network, was twice as long in the row's one program)."""
    incl = tl.cumsum(reach.to(tl.int32), 0)
    j = tl.arange(0, NT_P2)
    t = tl.zeros([NT_P2], tl.int32)
    for s in tl.static_range(1, 15):
        if (NT_P2 >> s) > 0:
            probe = t + (NT_P2 >> s) - 1
            t = tl.where(tl.gather(incl, probe, 0) <= j, t + (NT_P2 >> s), t)
    return tl.gather(key, tl.minimum(t, NT_P2 - 1), 0)


@triton.jit
def _compact(xs_ptr, is_ptr, base, ok, x, ids, LB, M, n_c, vmin, vmass):
    """Append the candidates x >= LB of these slots to the row's list, in slot order; running
    count, per-lane min and per-lane mass e^(x - M) of the list."""
    sel = ok & (x >= LB)
    pos = n_c + tl.cumsum(sel.to(tl.int32), 0) - 1
    tl.store(xs_ptr + base + pos, x, mask=sel)
    tl.store(is_ptr + base + pos, ids, mask=sel)
    n_c += tl.sum(sel.to(tl.int32), axis=0)
    vmin = tl.minimum(vmin, tl.where(sel, x, float("inf")))
    vmass += tl.where(sel, tl.exp(x - M), 0.0)
    return n_c, vmin, vmass


@triton.jit
def _list_block(xs_ptr, base, n, b0, CB: tl.constexpr):
    """CB entries of the row's compacted candidate list (n entries from base)."""
    idx = b0 + tl.arange(0, CB)
    ok = idx < n
    x = tl.load(xs_ptr + base + idx, mask=ok, other=float("-inf"))
    return base + idx, ok, x


@triton.jit
def _draw_list(xs_ptr, is_ptr, base, n_c, M, Z, tau, lminp, k0, k1, z_f, best, bidx, bx,
               WRITE_PROBS: tl.constexpr, LB: tl.constexpr):
    """The draw over the row's list (its kept set: x >= tau, x - M >= ln min_p): (Z_f, best
    score, its token (lowest id on a tie; the list is in id order except for re-read dirty
    blocks' tokens, appended), its x); the inputs are returned where nothing is kept.
    Per-lane sums and maxima, reduced once after the loop: an iteration is two loads, the hash
    and logs, no cross-lane reduction (a wide nucleus or a min-p set is ~15 iterations)."""
    zl = tl.zeros([LB], tl.float32)
    sb = tl.full([LB], float("-inf"), tl.float32)
    sid = tl.full([LB], NO_ID, tl.int32)
    sx = tl.zeros([LB], tl.float32)
    for b0 in range(0, n_c, LB):
        slot, ok, x = _list_block(xs_ptr, base, n_c, b0, LB)
        e = tl.exp(x - M)
        keep = ok & (x >= tau) & (x - M >= lminp)
        zl += tl.where(keep, e, 0.0)
        if not WRITE_PROBS:
            ids = tl.load(is_ptr + slot, mask=ok, other=0)
            score = tl.where(keep, (x - M) + _gumbel(k0, k1, ids), float("-inf"))
            sb, sid, sx = _better(score, ids, tl.where(keep, x, 0.0), sb, sid, sx)
    # the whole row kept (tau is -inf only without top-k and top-p): its mass is Z, as on
    # every path of such a row (kernels/README.md, "One normaliser for a row ...")
    z_f += tl.where((tau == float("-inf")) & (lminp == float("-inf")), Z, tl.sum(zl, axis=0))
    if not WRITE_PROBS:
        # the lanes' winners in one reduction by the draw's rule (the winner's lane carries
        # its x; _best's three reductions were a chain on this program's critical path)
        tb, tid, tx = tl.reduce((sb, sid, sx), 0, _better)
        found = tb > float("-inf")
        bidx = tl.where(found, tid.to(tl.int64), bidx)
        bx = tl.where(found, tx, bx)
        best = tl.maximum(best, tb)
    return z_f, best, bidx, bx


# _prune_bound's slack in units of x past a bin's lower edge: (M - x) * INV_W rounds by at most
# 2^-23 of itself (< 2^-18 here), and the fp32 sums of up to ~10^4 masses compared (the bound's
# and the list's) by ~2^-11 each; an LB too high costs only a fallback (below), never a token
BIN_SLACK = tl.constexpr(2.0 ** -9)


@triton.jit
def _prune_bound(hist, M, k, target, k_act, p_act, NB: tl.constexpr, INV_W: tl.constexpr):
    """A value LB, almost surely <= the final threshold, from a count histogram of the
    candidates over bins (M - x) * INV_W in [i, i + 1). Bin i's values are >= its lower edge
    M - (i + 1) / INV_W (less BIN_SLACK for rounding), so W(edge_j) >= sum_{i <= j} count_i
    (top-k) and >= sum_{i <= j} count_i exp(-(i + 1) / INV_W) (mass, top-p), where the row's
    max counts its exact mass 1 (a bin-0 candidate of every row the candidates can finish:
    else its block stored nothing and G = M): the first bin j where
    that reaches the target gives LB. Candidates are a subset of the row, so both are lower
    bounds of the row's W; the last bin is open-ended (no bound). The merge never relies on
    LB <= tau for a token: a list whose mass is below the target is not exact (v2's bound,
    two bins below, left a 1,600-entry list on N(0, 5^2) rows whose nucleus is 40 tokens, and
    no bound at all where the max alone holds ~p of the mass)."""
    i = tl.arange(0, NB)
    jk = tl.sum((tl.cumsum(hist, 0) < k).to(tl.int32), axis=0)
    e = tl.exp(-((i + 1).to(tl.float32) * (1.0 / INV_W) + BIN_SLACK))
    wl = hist.to(tl.float32) * e + tl.where((i == 0) & (hist > 0), 1.0 - e, 0.0)
    jp = tl.sum((tl.cumsum(wl, 0) < target).to(tl.int32), axis=0)
    j = tl.where(k_act, jk, jp)
    ok = (k_act | p_act) & (j < NB - 1)
    return tl.where(ok, M - ((j + 1).to(tl.float32) * (1.0 / INV_W) + BIN_SLACK),
                    float("-inf"))


@triton.jit
def _lane_partials(xs_ptr, base, n, M, piv, USE_COUNT: tl.constexpr, CB: tl.constexpr,
                   NPIV: tl.constexpr):
    """common._pivot_partials over a list of several blocks: each lane keeps its [NPIV]
    partials across the blocks and the CTA reduces them once (a reduction per block made a
    wide nucleus's rounds latency-bound). The list is the same for any chunking, so is this
    order."""
    cnt = tl.zeros([CB, NPIV], tl.float32)
    mass = tl.zeros([CB, NPIV], tl.float32)
    nxt = tl.full([CB, NPIV], float("inf"), tl.float32)
    prv = tl.full([CB, NPIV], float("-inf"), tl.float32)
    for b0 in range(0, n, CB):
        _, _, x = _list_block(xs_ptr, base, n, b0, CB)
        ge = x[:, None] >= piv[None, :]
        if USE_COUNT:
            cnt += ge.to(tl.float32)
        mass += tl.where(ge, tl.exp(x - M)[:, None], 0.0)
        nxt = tl.minimum(nxt, tl.where(ge, x[:, None], float("inf")))
        prv = tl.maximum(prv, tl.where(ge, float("-inf"), x[:, None]))
    # the four in one reduction: one cross-warp exchange
    nxt, prv, cnt, mass = tl.reduce((nxt, prv, cnt, mass), 0, _edges_combine)
    return cnt, mass, nxt, prv


@triton.jit
def _cand_search(xs_ptr, base, n, M, lo, pv, lo_mass, target,
                 USE_COUNT: tl.constexpr, CB: tl.constexpr,
                 NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    """tau = max{t : W(t) >= target} over the compacted candidates (W = count or mass of
    x >= t). Needs W(lo) >= target; returns (tau, W_mass(tau)). A list of one block keeps
    v2's rounds; a longer one (a wide nucleus) reduces per-lane partials once a round."""
    if n <= CB:
        lo, lo_mass = _search_rounds(xs_ptr, base, n, M, lo, pv, lo_mass, target, USE_COUNT,
                                     False, CB, NPIV, MAX_ROUNDS)
    else:
        lo, lo_mass = _search_rounds(xs_ptr, base, n, M, lo, pv, lo_mass, target, USE_COUNT,
                                     True, CB, NPIV, MAX_ROUNDS)
    return lo, lo_mass


@triton.jit
def _search_rounds(xs_ptr, base, n, M, lo, pv, lo_mass, target, USE_COUNT: tl.constexpr,
                   LANES: tl.constexpr, CB: tl.constexpr, NPIV: tl.constexpr,
                   MAX_ROUNDS: tl.constexpr):
    """_cand_search's pivot rounds, partials per block (LANES False) or per lane."""
    rounds = tl.zeros([], tl.int32)
    while (lo < pv) & (rounds < MAX_ROUNDS):
        piv = _pivots(lo, pv, NPIV)
        if LANES:
            cnt, mass, nxt, prv = _lane_partials(xs_ptr, base, n, M, piv, USE_COUNT, CB, NPIV)
        else:
            cnt, mass, nxt, prv = _pivot_init(NPIV)
            for b0 in range(0, n, CB):
                slot, ok, x = _list_block(xs_ptr, base, n, b0, CB)
                cnt, mass, nxt, prv = _pivot_partials(x, tl.exp(x - M), piv, cnt, mass, nxt,
                                                      prv, USE_COUNT)
        lo, pv, lo_mass = _pivot_update(cnt, mass, nxt, prv, lo, pv, lo_mass, target, NPIV,
                                        USE_COUNT)
        rounds += 1
    return lo, lo_mass


@triton.jit
def _row_search(lrow, erow, brow, xrow, NT, V, rep, pres, freq, tdiv, M, lo, pv, lo_mass, target,
                arow, la, beta, me,
                USE_COUNT: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
                NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr,
                HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                HAS_BIAS: tl.constexpr, CD: tl.constexpr):
    """The same search over the whole row (fallback): one pass over the logits per round."""
    rounds = tl.zeros([], tl.int32)
    while (lo < pv) & (rounds < MAX_ROUNDS):
        piv = _pivots(lo, pv, NPIV)
        cnt, mass, nxt, prv = _pivot_init(NPIV)
        for t in range(0, NT):
            offs, inb, xp, _, _, _ = _penalised_tile(
                lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK,
                HAS_BIAS,
                arow, la, beta, me, CD, False)
            x = _quotient(xp, tdiv)
            cnt, mass, nxt, prv = _pivot_partials(x, tl.exp(x - M), piv, cnt, mass, nxt, prv,
                                                  USE_COUNT, False)
        lo, pv, lo_mass = _pivot_update(cnt, mass, nxt, prv, lo, pv, lo_mass, target, NPIV,
                                        USE_COUNT)
        rounds += 1
    return lo, lo_mass


@triton.jit
def _max_max_min(a1, b1, c1, a2, b2, c2):
    """(max, max, min) of three operands in one reduction."""
    return tl.maximum(a1, a2), tl.maximum(b1, b2), tl.minimum(c1, c2)


@triton.jit
def _min_add(a1, b1, a2, b2):
    """(min, sum) of two operands in one reduction."""
    return tl.minimum(a1, a2), b1 + b2


@triton.jit
def _add_or(a1, f1, a2, f2):
    """(sum, bitwise or) of two operands in one reduction."""
    return a1 + a2, f1 | f2


@triton.jit
def _row_z(wfrow, NT, tt, tin, m_t, M):
    """Z = sum z_t e^(m_t - M) over the blocks (a fixed tree over block indices: the same for
    any chunk count and batch)."""
    z_t = tl.load(wfrow + F_Z * NT + tt, mask=tin, other=0.0)
    return tl.sum(tl.where(m_t > float("-inf"), z_t * tl.exp(m_t - M), 0.0), axis=0)


@triton.jit
def _row_xpmax(lrow, erow, brow, xrow, NT, V, rep, pres, freq, arow, la, beta, me,
               TILE: tl.constexpr, E_BLOCK: tl.constexpr, HAS_REP: tl.constexpr,
               HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
               CD: tl.constexpr):
    """max xp over the row's non-NaN tokens: one pass, for rows whose x overflowed."""
    best = tl.full([], float("-inf"), tl.float32)
    for t in range(0, NT):
        _, _, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                                         TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                                         arow, la, beta, me, CD, False)
        best = tl.maximum(best, tl.max(tl.where(xp == xp, xp, float("-inf")), axis=0))
    return best


@triton.jit
def _first_index(lrow, erow, brow, xrow, cand_ptr, row, NT, V, tb, ncand, target,
                 rep, pres, freq, arow, la, beta, me,
                 KT: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
                 HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                 HAS_BIAS: tl.constexpr, CD: tl.constexpr):
    """The first token of block tb whose xp equals target (greedy rows, x = xp). From the
    block's candidates (stored in id order; they hold its max) when it kept any and target is
    finite, else from the block itself (one block re-read: tie-heavy blocks, +inf)."""
    idx = tl.full([], 2147483647, tl.int32)
    if (ncand > 0) & (target < float("inf")):
        kl = tl.arange(0, KT)
        cb = (row * NT + tb) * KT
        v = tl.load(cand_ptr + cb + kl, mask=kl < ncand, other=EMPTY_SLOT)
        idx = tl.min(tl.where(_cand_x(v) == target, _cand_id(v), 2147483647), axis=0)
    else:
        offs, inb, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, tb, V, rep, pres, freq,
                                              TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS,
                                              arow, la, beta, me, CD, False)
        idx = tl.min(tl.where(inb & (xp == target), offs, 2147483647), axis=0)
    return idx.to(tl.int64)


@triton.jit
def _row_pass(lrow, erow, brow, xrow, arow, NT, V, rep, pres, freq, tdiv, M, Z, lmin, k, p, lminp,
              k_act, p_act, ovf, xpmax, la, beta, Me, seed_ptr, seed_s, off_ptr, off_s, row,
              z_f, best, bidx, bx, TILE: tl.constexpr, E_BLOCK: tl.constexpr, NPIV: tl.constexpr,
              MAX_ROUNDS: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
              HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, CD: tl.constexpr,
              WRITE_PROBS: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr):
    """The exact row pass (last resort, one program): the top-k then top-p search over the
    row itself (one pass per round), then one draw pass: keep x >= tau with x - M >= ln min_p,
    Z_f, the Gumbel argmax (lowest id on ties). Overflowed rows (ovf) keep xp's argmax tie group
    with x = 0. Shared by the merge and kernels/band.py's finish (rows whose band failed), so
    both give the same answer. Returns (M, tau, Z_f, best score, token, its x); where the whole
    row is kept, the merge's _route takes Z instead of this Z_f. The row key is made after the
    searches, so that neither it nor the seed is held through them (at the 128-register cap
    the merge spilled it there)."""
    M = tl.where(ovf, 0.0, M)
    tau = tl.where(ovf, 0.0, lmin)
    zk = Z
    if k_act & (~ovf):
        tau, zk = _row_search(lrow, erow, brow, xrow, NT, V, rep, pres, freq, tdiv, M, lmin,
                              M, Z, k.to(tl.float32), arow, la, beta, Me, True, TILE, E_BLOCK,
                              NPIV, MAX_ROUNDS, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD)
    if p_act & (~ovf):
        tau, zk = _row_search(lrow, erow, brow, xrow, NT, V, rep, pres, freq, tdiv, M, tau, M,
                              zk, p * zk, arow, la, beta, Me, False, TILE, E_BLOCK, NPIV,
                              MAX_ROUNDS, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD)
    k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
    for t in range(0, NT):
        offs, inb, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                                              TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK,
                                              HAS_BIAS, arow, la, beta, Me, CD, False)
        x = _tempered(xp, tdiv, ovf, xpmax)
        e = tl.exp(x - M)
        keep = inb & (x >= tau) & (x - M >= lminp)
        z_f += tl.sum(tl.where(keep, e, 0.0), axis=0)
        if not WRITE_PROBS:
            score = tl.where(keep, (x - M) + _gumbel(k0, k1, offs), float("-inf"))
            # the tile's winner by the draw's rule in one reduction (three before)
            tb, ti, tx = tl.reduce((score, tl.arange(0, TILE), x), 0, _better)
            upd = tb > best
            bidx = tl.where(upd, tl.cast(t, tl.int64) * TILE + ti.to(tl.int64), bidx)
            bx = tl.where(upd, tx, bx)
            best = tl.maximum(best, tb)
    return M, tau, z_f, best, bidx, bx


@triton.jit
def _store_flags(sf_ptr, si_ptr, row, xpmax, valid, sampling, ovf, gidx):
    """The row state's part known before the searches: max xp, flags, greedy token."""
    tl.store(sf_ptr + row * NS + S_XPMAX, xpmax)
    flags = valid.to(tl.int32) + 2 * sampling.to(tl.int32) + 4 * ovf.to(tl.int32)
    tl.store(si_ptr + row * 2, flags)
    tl.store(si_ptr + row * 2 + 1, gidx.to(tl.int32))


@triton.jit
def _merge_params(temp_ptr, temp_s, topk_ptr, topk_s, topp_ptr, topp_s, minp_ptr, minp_s,
                  rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, la_ptr, la_s, beta_ptr,
                  beta_s, row, TEMP_T: tl.constexpr, TOPK_T: tl.constexpr,
                  TOPP_T: tl.constexpr, MINP_T: tl.constexpr, REP_T: tl.constexpr,
                  PRES_T: tl.constexpr, FREQ_T: tl.constexpr, LA_T: tl.constexpr,
                  BETA_T: tl.constexpr, CD: tl.constexpr):
    """The row's parameters: (T, rep, pres, freq, k, p, ln min_p, cd alpha's log, cd beta,
    greedy, bad, the divisor of x = xp / T); a bad row is answered invalid, not sampled."""
    T = _param(temp_ptr, temp_s, row, TEMP_T)
    rep = _param(rep_ptr, rep_s, row, REP_T)
    pres = _param(pres_ptr, pres_s, row, PRES_T)
    freq = _param(freq_ptr, freq_s, row, FREQ_T)
    k = _param(topk_ptr, topk_s, row, TOPK_T, tl.int64)
    p = _param(topp_ptr, topp_s, row, TOPP_T)
    lminp = _param(minp_ptr, minp_s, row, MINP_T)
    greedy = T == 0.0
    bad = _bad_row(T, rep, pres, freq) | (k < 0)
    bad = bad | (~((p >= 0.0) & (p <= 1.0))) | (~(lminp <= 0.0))
    la = _param(la_ptr, la_s, row, LA_T)
    beta = _param(beta_ptr, beta_s, row, BETA_T)
    if CD:
        bad = bad | (la != la) | (~((beta >= 0.0) & (beta < float("inf"))))
    tdiv = tl.where(greedy | bad, 1.0, T)
    return T, rep, pres, freq, k, p, lminp, la, beta, greedy, bad, tdiv


@triton.jit
def _cd_head(lrow, arow, erow, brow, xrow, wfrow, wirow, wcrow, cand_ptr, row, NT, V, rep,
             pres, freq, tdiv, la, beta, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
             KT: tl.constexpr, NWIN: tl.constexpr, D0_EXP: tl.constexpr, HAS_REP: tl.constexpr,
             HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
             R: tl.constexpr, NT_P2: tl.constexpr):
    """Contrastive decoding: make the block partials those of the row's head. Me = the max of
    the blocks' expert maxima; blocks whose max is outside Me's head are emptied, blocks whose
    local head holds a token outside it are re-read with Me. Returns Me."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    me_t = tl.load(wcrow + tt, mask=tin, other=float("-inf"))
    elo_t = tl.load(wcrow + NT + tt, mask=tin, other=float("inf"))
    Me = tl.max(me_t, axis=0)
    dropped = tin & (~_head(me_t, Me, la))
    dirty = tin & (~dropped) & (~(_head(elo_t, Me, la) | (elo_t == float("inf"))))
    ninf = tl.full([NT_P2], float("-inf"), tl.float32)
    zero = tl.zeros([NT_P2], tl.int32)
    tl.store(wfrow + F_M * NT + tt, ninf, mask=dropped)
    tl.store(wfrow + F_Z * NT + tt, tl.zeros([NT_P2], tl.float32), mask=dropped)
    tl.store(wfrow + F_LO * NT + tt, -ninf, mask=dropped)
    tl.store(wfrow + F_G * NT + tt, ninf, mask=dropped)
    tl.store(wirow + I_NFIN * NT + tt, zero, mask=dropped)
    tl.store(wirow + I_NPOS * NT + tt, zero, mask=dropped)
    tl.store(wirow + I_NCAND * NT + tt, zero, mask=dropped)
    t = tl.min(tl.where(dirty, tt, NT_P2), axis=0)
    while t < NT:
        _block_stats(lrow, arow, erow, brow, xrow, wfrow, wirow, cand_ptr, row, NT, t, V,
                     rep, pres, freq, tdiv, _log2e_scale(tdiv), la, beta, Me,
                     tl.zeros([], tl.uint32), tl.zeros([], tl.uint32), wcrow, wcrow, wcrow,
                     wcrow, TILE, E_BLOCK, KT, NWIN, D0_EXP, HAS_REP, HAS_PF, HAS_MASK,
                     HAS_BIAS, True, False, R, False, False, 0, False, False)
        t = tl.min(tl.where(dirty & (tt > t), tt, NT_P2), axis=0)
    tl.debug_barrier()  # the block partials above are read back by other threads
    return Me


@triton.jit
def _row_partials(wfrow, wirow, NT, NT_P2: tl.constexpr, CD: tl.constexpr):
    """The blocks' partials merged in block order: (m_t, M, G, lmin, Z, nfin, npos_t, npos,
    nnan, ncand_t); npos and nnan 0 / 1, whether any block has one. M, G and lmin in one
    reduction, the count and the two flags in another (_row_flags), Z in a third (tl.sum: the
    order of every path that sums the blocks' masses, also under the interpreter): three
    cross-warp exchanges where the row's one program waited on five (all in one spilled the
    per-row variants)."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    m_t = tl.load(wfrow + F_M * NT + tt, mask=tin, other=float("-inf"))
    M, G, lmin = tl.reduce(
        (m_t, tl.load(wfrow + F_G * NT + tt, mask=tin, other=float("-inf")),
         tl.load(wfrow + F_LO * NT + tt, mask=tin, other=float("inf"))), 0, _max_max_min)
    npos_t = tl.load(wirow + I_NPOS * NT + tt, mask=tin, other=0)
    nfin, npos, nnan = _row_flags(wirow, NT, tt, tin, npos_t, CD)
    Z = _row_z(wfrow, NT, tt, tin, m_t, M)
    ncand_t = tl.load(wirow + I_NCAND * NT + tt, mask=tin, other=0)
    return m_t, M, G, lmin, Z, nfin, npos_t, npos, nnan, ncand_t


@triton.jit
def _row_flags(wirow, NT, tt, tin, npos_t, CD: tl.constexpr):
    """(finite tokens, any +inf x 0 / 1, any NaN 0 / 1) of the row: one reduction of the count
    and a flag word, or three in the contrastive merge (the pair spilled it at its cap)."""
    nfin_t = tl.load(wirow + I_NFIN * NT + tt, mask=tin, other=0)
    nnan_t = tl.load(wirow + I_NNAN * NT + tt, mask=tin, other=0)
    if CD:
        nfin = tl.sum(nfin_t, axis=0)
        flags = (tl.sum(npos_t, axis=0) > 0).to(tl.int32)
        flags = flags | ((tl.sum(nnan_t, axis=0) > 0).to(tl.int32) << 1)
    else:
        flags = (npos_t > 0).to(tl.int32) | ((nnan_t > 0).to(tl.int32) << 1)
        nfin, flags = tl.reduce((nfin_t, flags), 0, _add_or)
    return nfin, flags & 1, flags >> 1


@triton.jit
def _row_kind(lrow, erow, brow, xrow, arow, cand_ptr, wirow, sf_ptr, si_ptr, tok_ptr, logp_ptr,
              row, NT, V, rep, pres, freq, la, beta, Me, m_t, M, npos_t, npos, nfin, nnan, greedy,
              bad, KT: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
              NT_P2: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
              HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, CD: tl.constexpr,
              WRITE_PROBS: tl.constexpr, STATE: tl.constexpr, KEEP_LIST: tl.constexpr):
    """(max xp, ovf, valid, sampling, the greedy token). Greedy rows have x = xp: max xp is M,
    or +inf. Rows with +inf x (not greedy) or no finite x (all -inf, or every xp overflowed to
    -inf) find max xp in one more pass; the token of a greedy row is found in one block. x
    overflowed (to +inf, or every finite xp to -inf): the limit T -> 0, uniform over the
    tokens with xp == max xp (the numeric policy); such rows take the fallback draw. A
    sampling call's answer for a row that does not sample (greedy: its token, logprob 0;
    invalid: -1, -inf) is final here and stored here (the greedy token, int64, held to the
    end spilled 8-16 bytes in the merge variants at the 128 cap)."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    xpmax = tl.where(npos > 0, float("inf"), M)
    if (~bad) & (nnan == 0) & (((npos > 0) & (~greedy)) | ((nfin == 0) & (npos == 0))):
        xpmax = _row_xpmax(lrow, erow, brow, xrow, NT, V, rep, pres, freq, arow, la, beta, Me,
                           TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD)
    ovf = (npos > 0) | ((nfin == 0) & (xpmax > float("-inf")))
    valid = (nnan == 0) & (xpmax > float("-inf")) & (~bad)
    sampling = valid & (~greedy)
    gidx = row * 0 - 1
    if valid & greedy:
        tb = tl.min(tl.where(tin & tl.where(npos > 0, npos_t > 0, m_t == M), tt, NT_P2), axis=0)
        ncand = tl.load(wirow + I_NCAND * NT + tb)
        gidx = _first_index(lrow, erow, brow, xrow, cand_ptr, row, NT, V, tb, ncand, xpmax,
                            rep, pres, freq, arow, la, beta, Me, KT, TILE, E_BLOCK,
                            HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD)
    if STATE or KEEP_LIST:
        # the row state of processed top-N logprobs (kernels/topn.py) or of the residual draw:
        # what is final here is stored here rather than kept live through the searches
        _store_flags(sf_ptr, si_ptr, row, xpmax, valid, sampling, ovf, gidx)
    if not WRITE_PROBS:
        if ~sampling:
            tl.store(tok_ptr + row, tl.where(valid, gidx, -1))
            tl.store(logp_ptr + row, tl.where(valid, 0.0, float("-inf")))
    return xpmax, ovf, valid, sampling, gidx


@triton.jit
def _pure_winner(wfrow, wirow, seed_ptr, seed_s, off_ptr, off_s, row, NT, tdiv, m_t, M,
                 SEED_T: tl.constexpr, OFF_T: tl.constexpr, NT_P2: tl.constexpr):
    """Pure temperature: the draw from the blocks' draw partials (proven, token, its x). No
    threshold: the kept set is every finite x and Z_f = Z. Stage 1 left each block's best
    approximate score s = fl(x' + G) (x' = fl(xp * fl(1 / T)) clamped at -FLT_MAX, within 4
    ulps of x; G from _gumbel_fast, within GUMBEL_FAST_ERR = 2^-18 of _gumbel's), that token's
    xp and id, and s2 = the block's next best s. The exact score fl(fl(x - M) + G) of every
    other token of block t is <= U_t = fl(s2_t - M) + 2^-20 (A_t + |M| + 64), A_t =
    max(|m_t|, |lo_t|) >= |x|: the roundings in between and G's error total at most
    2^-24 (8 A_t + 3 |M| + 69 + 64) (|G| <= 22.9: common._gumbel_of's noise is finite, in
    [-2.81, 22.87]). So if the best exact block score beats every U_t, it is the row's
    maximum, ties to the lowest id, the same token the row pass draws; else the row takes
    the fallback."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
    bx_t = _quotient(tl.load(wfrow + F_BX * NT + tt, mask=tin, other=float("-inf")), tdiv)
    s2_t = tl.load(wfrow + F_S2 * NT + tt, mask=tin, other=float("-inf"))
    bid_t = tl.load(wirow + I_BID * NT + tt, mask=tin, other=0)
    lo_t = tl.load(wfrow + F_LO * NT + tt, mask=tin, other=float("inf"))
    has = tin & (m_t > float("-inf")) & (bx_t > float("-inf"))
    e_t = tl.where(has, (bx_t - M) + _gumbel(k0, k1, bid_t), float("-inf"))
    pbest = tl.max(e_t, axis=0)
    pid = tl.min(tl.where(has & (e_t == pbest), bid_t, 2147483647), axis=0)
    a_t = tl.maximum(tl.abs(m_t), tl.abs(lo_t))
    u_t = tl.where(has & (s2_t > float("-inf")),
                   (s2_t - M) + DRAW_SLACK * (a_t + tl.abs(M) + 64.0), float("-inf"))
    proven = pbest > tl.max(u_t, axis=0)
    pbx = tl.max(tl.where(has & (bid_t == pid), bx_t, float("-inf")), axis=0)
    return proven, pid.to(tl.int64), pbx


@triton.jit
def _list_bound(cand_ptr, row, NT, m_t, ncand_t, M, G, Z, k, p, lminp, tdiv, k_act, p_act,
                NB: tl.constexpr, INV_W: tl.constexpr, KT: tl.constexpr, CB: tl.constexpr,
                NT_P2: tl.constexpr, HAS_MINP: tl.constexpr):
    """(LB, listed): a bound LB <= tau from a histogram of the candidates (the candidates >= LB
    are then compacted, slot order, into the row's list: the searches and the draw scan only
    it), and whether the row gets a list at all."""
    tt = tl.arange(0, NT_P2)
    hist = tl.zeros([NB], dtype=tl.int32)
    # k distinct blocks have a max >= the k-th largest block max: a free bound on tau_k
    m_sorted = tl.sort(m_t, descending=True)
    LBk = tl.max(tl.where(tt == k - 1, m_sorted, float("-inf")), axis=0)
    use_lbk = k_act & (k <= NT)
    # Top-p alone whose candidates cannot hold p Z by their blocks' maxima needs no
    # histogram, prune bound or list (LB = -inf, listed = 0): the band read or the row
    # pass takes the row, as the histogram's tighter bound would send it (flat rows)
    few = p_act & (~k_act) & (G > float("-inf"))
    if few:
        few = _cand_mass_bound(m_t, ncand_t, M) < p * Z
    LB = tl.full([], float("-inf"), tl.float32)
    listed = NT * 0
    if ~few:
        if (k_act | p_act) & (~use_lbk):
            # a candidate's bin (M - x) INV_W as one fma of xp and fl(INV_W / T): a bound's
            # bin needs no exact x (the quotient's correction was ~3% of the merge's cycles,
            # modelled); xp fl(1 / T) is within |x| 2^-24 of x, inside BIN_SLACK as M - x's
            # own rounding is, and an LB too high costs a fallback, never a token
            rw = _reciprocal(tdiv) * INV_W
            mw = M * INV_W
            ok, v = _slot_load(cand_ptr, row, NT, 0, ncand_t, KT, CB, NT_P2)
            for b0 in range(CB, NT * KT + CB, CB):
                ok_n, v_n = _slot_load(cand_ptr, row, NT, b0, ncand_t, KT, CB, NT_P2)
                d = tl.minimum(tl.fma(-_cand_x(v), rw, mw), NB - 1)
                hist += tl.histogram(tl.where(ok, d, NB - 1).to(tl.int32), NB, mask=ok)
                ok, v = ok_n, v_n
        LB = _prune_bound(hist, M, k, p * Z, k_act, p_act, NB, INV_W)
        LB = tl.where(use_lbk, LBk, LB)
        if HAS_MINP:
            # Min-p alone keeps only x >= M + ln(min_p): the list needs no other candidate
            # (the draw tests x - M >= ln min_p itself), and few dirty blocks are re-read
            # here rather than the row handed to the second read. The slack exceeds the
            # roundings of x - M, exp and log (~2^-14) and of M's magnitude (2^-23 |M|).
            mlb = (M + lminp) - (0.0625 + tl.abs(M) * 1e-6)
            LB = tl.where((~k_act) & (~p_act) & (lminp > float("-inf")), mlb, LB)
        # Top-p alone whose candidates cannot hold p Z is not exact whatever the list (a
        # bin-i candidate has e <= e^(-(i - 1) / INV_W), one bin of slack for rounding): no
        # compaction (a third of this program on flat rows; the band read takes the row)
        listed = NT * 0 + 1
        if p_act & (~k_act) & (G > float("-inf")):
            ib = tl.maximum(tl.arange(0, NB) - 1, 0).to(tl.float32)
            ub = tl.sum(hist.to(tl.float32) * tl.exp(-ib * (1.0 / INV_W)), axis=0)
            listed = tl.where(ub < p * Z, 0, listed)
    return LB, listed


@triton.jit
def _dirty_blocks(wfrow, NT, LB, ncand_t, G, DIRTY_MAX: tl.constexpr, NT_P2: tl.constexpr):
    """(dirty, redo, ncand_t, G). Dirty blocks: g_t >= LB, so tokens >= LB (possibly kept)
    were left out of their candidates (a block whose window overflowed, e.g. one dominant
    token and a long bulk behind it). When there are few (<= DIRTY_MAX), their candidates are
    skipped and the merge re-reads those blocks instead, appending every token >= LB: the
    list then holds *every* token >= LB of the row, so a threshold >= LB found on it is exact
    with G replaced by the largest g of the clean blocks (< LB). Costs ndirty / NT of a pass;
    v2 re-read the whole row, once per search round."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    dirty = tt < 0
    redo = NT < 0
    if LB > float("-inf"):
        g_t = tl.load(wfrow + F_G * NT + tt, mask=tin, other=float("-inf"))
        dirty = tin & (g_t >= LB)
        # the count and the clean blocks' max in one reduction (one exchange)
        ndirty, g_clean = tl.reduce((dirty.to(tl.int32), tl.where(dirty, float("-inf"), g_t)),
                                    0, _add_max)
        redo = (ndirty > 0) & (ndirty <= DIRTY_MAX)
        ncand_t = tl.where(redo & dirty, 0, ncand_t)
        G = tl.where(redo, g_clean, G)
    return dirty, redo, ncand_t, G


@triton.jit
def _reached_list(cand_ptr, xs_ptr, is_ptr, base, row, NT, m_t, ncand_t, LB, listed, M, tdiv,
                  KT: tl.constexpr, CB: tl.constexpr, NT_P2: tl.constexpr,
                  BANDS: tl.constexpr):
    """The row's list: the candidates >= LB, compacted in slot order; (count, min x, mass).
    Only blocks whose max reaches LB can hold a candidate >= LB: visit those, in block order
    (the list is the same). About k of the NT blocks for top-k (LB the k-th largest block
    max); a few for top-p and min-p rows whose bound lies near the top (one or two blocks of
    a confident row, a third of an N(0, 5^2) row's); every non-empty block where there is no
    bound. Emptied blocks (CD, m_t = -inf) never reach it."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    n_c = tl.zeros([], tl.int32)
    # the band merge compacts CB / 2 slots a step: at CB it spilled 16 bytes
    CS: tl.constexpr = CB // 2 if BANDS else CB
    vmin = tl.full([CS], float("inf"), tl.float32)
    vmass = tl.zeros([CS], tl.float32)
    reach = tin & (m_t >= LB) & (m_t > float("-inf")) & (listed > 0)
    nreach = tl.sum(reach.to(tl.int32), axis=0)
    if nreach > 0:
        # one key carries each block and its count: one gather a slot
        tl.static_assert((KT < 65536) & (NT_P2 <= 16384))
        order = _reached_order(reach, tt * 65536 + ncand_t, NT_P2)
        ok, v = _reached_slots(cand_ptr, row, NT, order, nreach, 0, KT, CS, NT_P2)
        for b0 in range(CS, nreach * KT + CS, CS):
            ok_n, v_n = _reached_slots(cand_ptr, row, NT, order, nreach, b0, KT, CS, NT_P2)
            n_c, vmin, vmass = _compact(xs_ptr, is_ptr, base, ok,
                                        _quotient(_cand_x(v), tdiv), _cand_id(v), LB, M, n_c,
                                        vmin, vmass)
            ok, v = ok_n, v_n
    # the list's min and mass in one reduction (one exchange)
    cmin, cmass = tl.reduce((vmin, vmass), 0, _min_add)
    return n_c, cmin, cmass


@triton.jit
def _redo_dirty(lrow, erow, brow, xrow, arow, xs_ptr, is_ptr, base, dirty, NT, V, rep, pres,
                freq, la, beta, Me, tdiv, LB, M, n_c, cmin, cmass, KT: tl.constexpr,
                TILE: tl.constexpr, E_BLOCK: tl.constexpr, NT_P2: tl.constexpr,
                HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
                HAS_BIAS: tl.constexpr, CD: tl.constexpr):
    """The dirty blocks re-read: every token >= LB appended to the list; (count, min x, mass,
    full: the list's capacity was reached, the row then falls back)."""
    tt = tl.arange(0, NT_P2)
    full = tl.zeros([], dtype=tl.int1)
    t = tl.min(tl.where(dirty, tt, NT_P2), axis=0)
    while t < NT:
        offs, inb, xp, _, _, _ = _penalised_tile(
            lrow, erow, brow, xrow, NT, t, V, rep, pres,
            freq, TILE, E_BLOCK, HAS_REP, HAS_PF,
            HAS_MASK, HAS_BIAS,
            arow, la, beta, Me, CD, False)
        x = _quotient(xp, tdiv)
        sel = inb & (x >= LB)
        nsel = tl.sum(sel.to(tl.int32), axis=0)
        full = full | (n_c + nsel > NT * KT)
        if ~full:
            pos = n_c + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(xs_ptr + base + pos, x, mask=sel)
            tl.store(is_ptr + base + pos, offs, mask=sel)
            n_c += nsel
            cmin = tl.minimum(cmin, tl.min(tl.where(sel, x, float("inf")), axis=0))
            cmass += tl.sum(tl.where(sel, tl.exp(x - M), 0.0), axis=0)
        t = tl.min(tl.where(dirty & (tt > t), tt, NT_P2), axis=0)
    return n_c, cmin, cmass, full


@triton.jit
def _list_thresholds(xs_ptr, base, n_c, M, Z, G, LB, cmin, cmass, k, p, complete, k_act,
                     p_act, exact, LB_BLOCK: tl.constexpr, NPIV: tl.constexpr,
                     MAX_ROUNDS: tl.constexpr):
    """(tau, exact): top-k then top-p searched on the row's list (n_c entries, min x cmin,
    mass cmass); exact where the threshold is > G (the list holds every token >= it)."""
    tau = tl.full([], float("-inf"), tl.float32)
    zk = Z
    if k_act:
        tau, zk = _cand_search(xs_ptr, base, n_c, M, cmin, M, cmass, k.to(tl.float32),
                               True, LB_BLOCK, NPIV, MAX_ROUNDS)
        exact = exact & (n_c >= k) & (tau > G)
    if p_act & exact:
        lo = tl.where(k_act, tau, cmin)
        lo_mass = tl.where(k_act, zk, cmass)
        target = p * zk
        # a list holding less than the target cannot give an exact tau (also where LB was
        # too high): skip the search (its rounds were half the merge of a flat top-p row).
        # Only a list of every token (p within rounding of 1) may fall short of it.
        exact = exact & ((lo_mass >= target) | (complete & (LB == float("-inf"))))
        exact = exact & (n_c > 0)
        if exact:
            tau, zk = _cand_search(xs_ptr, base, n_c, M, lo, M, lo_mass, target,
                                   False, LB_BLOCK, NPIV, MAX_ROUNDS)
            # p Z = 0 (top-p 0) is held by a pivot above the list's max, which snaps to
            # +inf where the list lacks the row's max (its top tie group left out, G = M):
            # top-p 0 keeps the top tie group, tau = M (exact only if that group is listed)
            tau = tl.minimum(tau, M)
            exact = exact & (tau > G)
    return tau, exact


@triton.jit
def _thresholds(lrow, erow, brow, xrow, arow, cand_ptr, xs_ptr, is_ptr, wfrow, base, row, NT,
                V, rep, pres, freq, la, beta, Me, tdiv, m_t, ncand_t, M, G, Z, k, p, lminp,
                k_act, p_act, exact, KT: tl.constexpr, CB: tl.constexpr, NT_P2: tl.constexpr,
                NB: tl.constexpr, INV_W: tl.constexpr, DIRTY_MAX: tl.constexpr,
                LB_BLOCK: tl.constexpr, NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr,
                TILE: tl.constexpr, E_BLOCK: tl.constexpr, HAS_REP: tl.constexpr,
                HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_MINP: tl.constexpr, CD: tl.constexpr, BANDS: tl.constexpr):
    """The thresholds on the candidates (module docstring): the row's list of candidates >= LB
    (dirty blocks re-read), then top-k and top-p searched on it. Returns (tau, the list's
    length, exact, ncand_t with the re-read blocks' counts dropped)."""
    LB, listed = _list_bound(cand_ptr, row, NT, m_t, ncand_t, M, G, Z, k, p, lminp, tdiv,
                             k_act, p_act, NB, INV_W, KT, CB, NT_P2, HAS_MINP)
    dirty, redo, ncand_t, G = _dirty_blocks(wfrow, NT, LB, ncand_t, G, DIRTY_MAX, NT_P2)
    complete = G == float("-inf")
    if (~k_act) & (~p_act):
        # min-p alone is exact only where every kept token is a candidate (G's token is
        # below the cut, G final here): else no list (flat rows: second read)
        listed = tl.where(complete | (G - M < lminp), listed, 0)
    redo = redo & (listed > 0)  # a row with no list re-reads no block either
    n_c, cmin, cmass = _reached_list(cand_ptr, xs_ptr, is_ptr, base, row, NT, m_t, ncand_t, LB,
                                     listed, M, tdiv, KT, CB, NT_P2, BANDS)
    if redo:
        n_c, cmin, cmass, full = _redo_dirty(
            lrow, erow, brow, xrow, arow, xs_ptr, is_ptr, base, dirty, NT, V, rep, pres, freq,
            la, beta, Me, tdiv, LB, M, n_c, cmin, cmass, KT, TILE, E_BLOCK, NT_P2, HAS_REP,
            HAS_PF, HAS_MASK, HAS_BIAS, CD)
        exact = exact & (~full)
    # the list's entries were stored by the lanes that compacted them and are searched in
    # other tiles (other threads): every store lands before the first search load
    tl.debug_barrier()
    tau, exact = _list_thresholds(xs_ptr, base, n_c, M, Z, G, LB, cmin, cmass, k, p, complete,
                                  k_act, p_act, exact, LB_BLOCK, NPIV, MAX_ROUNDS)
    if (~k_act) & (~p_act):
        exact = exact & (complete | (G - M < lminp))
    return tau, n_c, exact, ncand_t


@triton.jit
def _active(sampling, k, p, lminp, nfin, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
            HAS_MINP: tl.constexpr):
    """(top-k active, top-p active, ln min_p or -inf) of a sampling row."""
    k_act = tl.zeros([], dtype=tl.int1)
    p_act = tl.zeros([], dtype=tl.int1)
    if HAS_TOPK:
        k_act = sampling & (k > 0) & (k < nfin)
    if HAS_TOPP:
        p_act = sampling & (p < 1.0)
    if not HAS_MINP:
        lminp = tl.full([], float("-inf"), tl.float32)
    return k_act, p_act, lminp


@triton.jit
def _pure_proof(wfrow, wirow, seed_ptr, seed_s, off_ptr, off_s, row, NT, V, T, k, p, lminp,
                tdiv, m_t, M, sampling, ovf, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
                NT_P2: tl.constexpr, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
                HAS_MINP: tl.constexpr, WRITE_PROBS: tl.constexpr, PURE_OK: tl.constexpr,
                CD: tl.constexpr):
    """(exact, pure, proven, token, its x): whether the row goes on to the thresholds on the
    candidates (exact), is a pure-temperature row, and its draw proven from the blocks' draw
    partials (_pure_winner; PURE_OK: stage 1 wrote them, a sampling launch without CD)."""
    exact = sampling & (~ovf)
    pure = exact & _pure_row(T, k, p, lminp, V, HAS_TOPK, HAS_TOPP, HAS_MINP)
    if CD:
        if not WRITE_PROBS:
            pure = pure & (~pure)  # stage 1 wrote no draw partials (CD rows are re-scored here)
    exact = exact & (~pure)
    proven = pure  # the distribution needs only Z_f = Z
    pbidx = row * 0 - 1
    pbx = tl.zeros([], tl.float32)
    if not WRITE_PROBS:
        proven = pure & (~pure)
    if PURE_OK:
        if pure:
            proven, pbidx, pbx = _pure_winner(wfrow, wirow, seed_ptr, seed_s, off_ptr, off_s,
                                              row, NT, tdiv, m_t, M, SEED_T, OFF_T, NT_P2)
    return exact, pure, proven, pbidx, pbx


@triton.jit
def _minp_alone(cand_ptr, row, NT, tdiv, ncand_t, M, G, Z, p, lminp, k_act, p_act, exact,
                KT: tl.constexpr, CB: tl.constexpr, NT_P2: tl.constexpr, HAS_TOPP: tl.constexpr):
    """p_act, off where top-p is irrelevant (HAS_TOPP): min-p's cut lies above every value it could
    pick. With every min-p-kept token a candidate (G - M < ln min_p), c = the smallest kept x
    and W(c) = their mass: W(c) < p Z gives tau_p < c, so the kept set is min-p's alone and
    the row needs no top-p search (v2 searched and, when the nucleus outgrew the candidates,
    fell back to the row). Top-k rows keep the search."""
    if HAS_TOPP:
        if exact & p_act & (~k_act) & (lminp > float("-inf")) & (G - M < lminp):
            wm = _cand_minp_mass(cand_ptr, row, NT, tdiv, ncand_t, M, lminp, KT, CB, NT_P2)
            p_act = p_act & (wm >= p * Z)
    return p_act


@triton.jit
def _hand_to_second(rf_ptr, wfrow, row, NT, m_t, ncand_t, M, Me, Z, lminp,
                    NT_P2: tl.constexpr, HAS_MINP: tl.constexpr, SCREEN: tl.constexpr):
    """A row with no threshold to search (min-p alone, an unproven pure row), handed to the
    second read (kernels/second.py), grid (B, C): every finite x, min-p applied there.
    Stores its plan: M, Me, Z where the row keeps every finite x (no min-p: its normaliser on
    every path) else -1, and the draw's screen bound (common.py) where the gather screens
    (SCREEN: the launcher's choice), -inf where every kept token is scored."""
    tl.store(rf_ptr + row * NR + R_M, M)
    tl.store(rf_ptr + row * NR + R_ME, Me)
    tl.store(rf_ptr + row * NR + R_Z, tl.where(lminp == float("-inf"), Z, -1.0))
    s_lb = tl.full([], float("-inf"), tl.float32)
    if SCREEN:
        wk = Z
        if HAS_MINP:
            tt = tl.arange(0, NT_P2)
            wk = tl.where(lminp > float("-inf"),
                          _kept_mass_bound(wfrow, NT, tt, tt < NT, m_t, ncand_t, M, lminp), Z)
        s_lb = _screen_bound(wk)
    tl.store(rf_ptr + row * NR + R_S, s_lb)


@triton.jit
def _draw_row(xs_ptr, is_ptr, sf_ptr, si_ptr, seed_ptr, seed_s, off_ptr, off_s, base, row, n_c,
              M, Z, tau, lminp, exact, sampling, pure, proven, pbidx, pbx,
              SEED_T: tl.constexpr, OFF_T: tl.constexpr, WRITE_PROBS: tl.constexpr,
              LB_BLOCK: tl.constexpr, STATE: tl.constexpr, KEEP_LIST: tl.constexpr):
    """The draw of a row the candidates decided (its list, or the pure row's proven winner):
    (Z_f, token, its x); -1 / 0 where neither holds."""
    z_f = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    bidx = row * 0 - 1
    bx = tl.zeros([], tl.float32)
    if exact:
        # the row key here, where it is used: not held through the searches nor the routing
        k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
        z_f, best, bidx, bx = _draw_list(xs_ptr, is_ptr, base, n_c, M, Z, tau, lminp, k0, k1,
                                         z_f, best, bidx, bx, WRITE_PROBS, LB_BLOCK)
    if STATE:  # tau is final here unless the row pass redoes the row (it stores its own)
        tl.store(sf_ptr + row * NS + S_TAU, tau)
    if KEEP_LIST:
        # a sampling row's greedy-token slot (-1) takes the list's length where the list holds
        # the kept set (else -1): speculative verification draws the residual from it
        # (kernels/residual.py). si_ptr is live here anyway: no register held for this.
        if sampling:
            tl.store(si_ptr + row * 2 + 1, tl.where(exact, n_c, -1))
    if pure & proven:
        z_f = Z
        bidx = pbidx
        bx = pbx
    return z_f, bidx, bx


@triton.jit
def _route(lrow, erow, brow, xrow, arow, wfrow, rf_ptr, sf_ptr, logp_ptr, hb_ptr, ft_ptr,
           boff_ptr, bf_ptr, bi_ptr, tab_ptr, seed_ptr, seed_s, off_ptr, off_s, row, NT, V, rep,
           pres, freq, tdiv, la, beta, Me, m_t, ncand_t, M, Z, lmin, k, p, lminp, k_act, p_act,
           ovf, xpmax, fallback, tau, z_f, bidx, bx, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
           KT: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr,
           NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr, NT_P2: tl.constexpr, HAS_REP: tl.constexpr,
           HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
           HAS_MINP: tl.constexpr, CD: tl.constexpr, WRITE_PROBS: tl.constexpr,
           STATE: tl.constexpr, SECOND: tl.constexpr, BANDS: tl.constexpr,
           SCREEN: tl.constexpr):
    """A row the candidates did not decide (fallback): handed to the second read (SECOND: no
    threshold to search; token -2, Z_f -1) or to the band read (BANDS: top-p without top-k,
    its plan made here where M and Z are, one launch fewer; token -3), else the exact row
    pass in this program. Returns (M, tau, Z_f, token, its x). A row that keeps every finite x
    (no top-k, top-p or min-p) takes Z for Z_f, its normaliser on every path: the second read
    from its plan (_hand_to_second), the row pass from the row's logprob slot, which holds Z
    (else -1) through the pass (held in a register, 4-16 bytes spilled at the 128 cap)."""
    if SECOND:
        # the hand-over is flagged in the outputs through values that are live anyway (16
        # bytes spilled otherwise)
        if fallback & (~ovf) & (~k_act) & (~p_act):
            _hand_to_second(rf_ptr, wfrow, row, NT, m_t, ncand_t, M, Me, Z, lminp, NT_P2,
                            HAS_MINP, SCREEN)
            fallback = fallback & (~fallback)
            bidx = bidx * 0 - 2
            z_f = z_f * 0.0 - 1.0
    if BANDS:
        if fallback & p_act & (~k_act) & (~ovf):
            fallback = fallback & (~fallback)
            bidx = bidx * 0 + BAND_ROW
            _plan_row(hb_ptr + row * NT * NBIN, ft_ptr + row * NT, boff_ptr + row * NT,
                      bf_ptr + row * NBF, bi_ptr + row * NBI, tab_ptr + row * NBUCK, NT,
                      NT * KT, M, Z, p, lminp, NT_P2)
    if fallback:
        if not WRITE_PROBS:  # (a row that keeps every finite x is pure and proven there)
            tl.store(logp_ptr + row, tl.where(
                (~k_act) & (~p_act) & (lminp == float("-inf")) & (~ovf), Z, -1.0))
        # the pass starts from a draw of nothing (the values _draw_row leaves such a row, as
        # constants) and makes its own row key: none of the six is held through the hand-overs
        M, tau, z_f, best, bidx, bx = _row_pass(
            lrow, erow, brow, xrow, arow, NT, V, rep, pres, freq, tdiv, M, Z, lmin, k, p, lminp,
            k_act, p_act, ovf, xpmax, la, beta, Me, seed_ptr, seed_s, off_ptr, off_s, row,
            tl.zeros([], tl.float32), tl.full([], float("-inf"), tl.float32),
            tl.full([], -1, tl.int64), tl.zeros([], tl.float32), TILE, E_BLOCK,
            NPIV, MAX_ROUNDS, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD, WRITE_PROBS, SEED_T, OFF_T)
        if not WRITE_PROBS:
            tl.debug_barrier()  # the slot was stored by another thread of this program
            z_kept = tl.load(logp_ptr + row)
            z_f = tl.where(z_kept > 0.0, z_kept, z_f)
        if STATE:
            tl.store(sf_ptr + row * NS + S_TAU, tau)
    return M, tau, z_f, bidx, bx


@triton.jit
def _write_row(tok_ptr, logp_ptr, sf_ptr, si_ptr, cnt_ptr, row, M, Me, tau, z_f, bidx, bx, gidx,
               xpmax, valid, sampling, ovf, greedy, WRITE_PROBS: tl.constexpr,
               STATE: tl.constexpr, KEEP_LIST: tl.constexpr, SECOND: tl.constexpr,
               BANDS: tl.constexpr):
    """The row's answer: its token and logprob, or (WRITE_PROBS, STATE) its row state; and
    the counts of rows handed to the second or band read (their programs' shares)."""
    if WRITE_PROBS or STATE:
        tl.store(sf_ptr + row * NS + S_M, M)
        tl.store(sf_ptr + row * NS + S_ZF, z_f)
    if WRITE_PROBS:
        tl.store(sf_ptr + row * NS + S_TAU, tau)
        tl.store(sf_ptr + row * NS + S_ME, Me)
        if not KEEP_LIST:
            _store_flags(sf_ptr, si_ptr, row, xpmax, valid, sampling, ovf, gidx)
        if SECOND:
            _list_handed(cnt_ptr, row, z_f < 0.0)
    elif sampling:  # (the other rows' answers are stored by _row_kind)
        tl.store(tok_ptr + row, bidx)
        # (a handed-over row's logprob is the second read's to write)
        tl.store(logp_ptr + row, (bx - M) - tl.log(z_f), mask=bidx != HANDED)
        if SECOND:
            _list_handed(cnt_ptr, row, bidx == HANDED)
        if BANDS:
            _count_row(cnt_ptr + SHARE_BAND, bidx == BAND_ROW)


@triton.jit(do_not_specialize=["topk_s", "seed_s", "off_s"])
def _merge_kernel(
    logits_ptr, stride_lb, V, NT,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, topk_ptr, topk_s, topp_ptr, topp_s, minp_ptr, minp_s,
    rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    seed_ptr, seed_s, off_ptr, off_s,
    wf_ptr, wi_ptr, cand_ptr, xs_ptr, is_ptr,
    tok_ptr, logp_ptr, sf_ptr, si_ptr, rf_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s, wc_ptr,
    hb_ptr, ft_ptr, bf_ptr, bi_ptr, boff_ptr, tab_ptr, cnt_ptr,
    TEMP_T: tl.constexpr, TOPK_T: tl.constexpr, TOPP_T: tl.constexpr, MINP_T: tl.constexpr,
    REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr,
    SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, HAS_MINP: tl.constexpr,
    HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
    WRITE_PROBS: tl.constexpr,
    TILE: tl.constexpr, E_BLOCK: tl.constexpr, KT: tl.constexpr, CB: tl.constexpr,
    NT_P2: tl.constexpr, NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr,
    NB: tl.constexpr, INV_W: tl.constexpr, LB_BLOCK: tl.constexpr, DIRTY_MAX: tl.constexpr,
    PURE_OK: tl.constexpr, SECOND: tl.constexpr, BANDS: tl.constexpr,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, CD: tl.constexpr, NWIN: tl.constexpr,
    D0_EXP: tl.constexpr, R: tl.constexpr, STATE: tl.constexpr, KEEP_LIST: tl.constexpr = False,
    HDIRECT: tl.constexpr = False, SCREEN: tl.constexpr = False,
):
    """Grid (B,). Reads 8 words per block, the candidates once per search round plus once for
    the draw (all from L2), and the logits only for fallback rows, greedy rows whose first
    maximum lies in a block that stored no candidates (one block), rows whose x overflowed or
    has no finite value (one pass for max xp) and, with CD, the blocks _cd_head re-reads.
    Writes the token and logprob (or, with WRITE_PROBS, the row state that _write_probs_kernel
    reads; with STATE both: kernels/topn.py's processed top-N logprobs read that state; with
    KEEP_LIST, in a sampling row's greedy-token slot, the length of the candidate list where
    it holds the row's kept set, else -1, for kernels/residual.py)."""
    row = tl.program_id(0).to(tl.int64)
    lrow, arow, erow, brow, xrow, wfrow, wirow = _row_bases(
        logits_ptr, stride_lb, am_ptr, stride_ab, edits_ptr, stride_eb, bnd_ptr, x_ptr,
        stride_xb, wf_ptr, wi_ptr, row, NT, HDIRECT)
    T, rep, pres, freq, k, p, lminp, la, beta, greedy, bad, tdiv = _merge_params(
        temp_ptr, temp_s, topk_ptr, topk_s, topp_ptr, topp_s, minp_ptr, minp_s, rep_ptr, rep_s,
        pres_ptr, pres_s, freq_ptr, freq_s, la_ptr, la_s, beta_ptr, beta_s, row, TEMP_T,
        TOPK_T, TOPP_T, MINP_T, REP_T, PRES_T, FREQ_T, LA_T, BETA_T, CD)
    Me = tl.zeros([], tl.float32)
    if CD:
        Me = _cd_head(lrow, arow, erow, brow, xrow, wfrow, wirow, wc_ptr + row * 2 * NT, cand_ptr,
                      row, NT, V, rep, pres, freq, tdiv, la, beta, TILE, E_BLOCK, KT, NWIN,
                      D0_EXP, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, R, NT_P2)
    m_t, M, G, lmin, Z, nfin, npos_t, npos, nnan, ncand_t = _row_partials(wfrow, wirow, NT,
                                                                          NT_P2, CD)
    xpmax, ovf, valid, sampling, gidx = _row_kind(
        lrow, erow, brow, xrow, arow, cand_ptr, wirow, sf_ptr, si_ptr, tok_ptr, logp_ptr, row, NT,
        V, rep, pres, freq, la, beta, Me, m_t, M, npos_t, npos, nfin, nnan, greedy, bad, KT, TILE,
        E_BLOCK, NT_P2, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, CD, WRITE_PROBS, STATE, KEEP_LIST)
    k_act, p_act, lminp = _active(sampling, k, p, lminp, nfin, HAS_TOPK, HAS_TOPP, HAS_MINP)
    exact, pure, proven, pbidx, pbx = _pure_proof(
        wfrow, wirow, seed_ptr, seed_s, off_ptr, off_s, row, NT, V, T, k, p, lminp, tdiv, m_t, M,
        sampling, ovf, SEED_T, OFF_T, NT_P2, HAS_TOPK, HAS_TOPP, HAS_MINP, WRITE_PROBS, PURE_OK,
        CD)
    if HAS_MINP:
        p_act = _minp_alone(cand_ptr, row, NT, tdiv, ncand_t, M, G, Z, p, lminp, k_act, p_act,
                            exact, KT, CB, NT_P2, HAS_TOPP)
    tau = tl.full([], float("-inf"), tl.float32)
    base = row * NT * KT
    n_c = tl.zeros([], tl.int32)
    if exact:
        tau, n_c, exact, ncand_t = _thresholds(
            lrow, erow, brow, xrow, arow, cand_ptr, xs_ptr, is_ptr, wfrow, base, row, NT, V, rep,
            pres, freq, la, beta, Me, tdiv, m_t, ncand_t, M, G, Z, k, p, lminp, k_act, p_act,
            exact, KT, CB, NT_P2, NB, INV_W, DIRTY_MAX, LB_BLOCK, NPIV, MAX_ROUNDS, TILE,
            E_BLOCK, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, HAS_MINP, CD, BANDS)
    z_f, bidx, bx = _draw_row(
        xs_ptr, is_ptr, sf_ptr, si_ptr, seed_ptr, seed_s, off_ptr, off_s, base, row, n_c, M, Z,
        tau, lminp, exact, sampling, pure, proven, pbidx, pbx, SEED_T, OFF_T, WRITE_PROBS,
        LB_BLOCK, STATE, KEEP_LIST)
    M, tau, z_f, bidx, bx = _route(
        lrow, erow, brow, xrow, arow, wfrow, rf_ptr, sf_ptr, logp_ptr, hb_ptr, ft_ptr, boff_ptr,
        bf_ptr, bi_ptr, tab_ptr, seed_ptr, seed_s, off_ptr, off_s, row, NT, V, rep, pres, freq,
        tdiv, la, beta, Me, m_t, ncand_t, M, Z, lmin, k, p, lminp, k_act, p_act, ovf, xpmax,
        sampling & (~exact) & (~(pure & proven)), tau, z_f, bidx, bx, SEED_T, OFF_T, KT, TILE,
        E_BLOCK, NPIV, MAX_ROUNDS, NT_P2, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, HAS_MINP, CD,
        WRITE_PROBS, STATE, SECOND, BANDS, SCREEN)
    _write_row(tok_ptr, logp_ptr, sf_ptr, si_ptr, cnt_ptr, row, M, Me, tau, z_f, bidx, bx, gidx,
               xpmax, valid, sampling, ovf, greedy, WRITE_PROBS, STATE, KEEP_LIST, SECOND, BANDS)


@triton.jit
def _count_row(cnt_ptr, busy):
    """Counts a row whose stored flag hands it to a second read, for the gathers' share of
    their grid (kernels/second.py _row_share: a hint, reset by stage 1). Nothing waits on it
    (a REDG in the SASS)."""
    if busy:
        tl.atomic_add(cnt_ptr, 1, sem="relaxed")


@triton.jit
def _list_handed(cnt_ptr, row, busy):
    """Counts a row handed to the second read and lists it at the slot its atomic gives
    (kernels/second.py _spread_handed: the gather's share of its grid; the count is reset by
    stage 1)."""
    if busy:
        slot = tl.atomic_add(cnt_ptr + SHARE_HANDED, 1, sem="relaxed")
        tl.store(_handed_list(cnt_ptr) + slot, row.to(tl.int32))


@triton.jit(do_not_specialize=["TPC"])
def _write_probs_kernel(
    logits_ptr, stride_lb, V, NT, TPC,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, minp_ptr, minp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    sf_ptr, si_ptr, probs_ptr, stride_pb,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, MINP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr,
    FREQ_T: tl.constexpr, HAS_MINP: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
    TILE: tl.constexpr, E_BLOCK: tl.constexpr, LA_T: tl.constexpr, BETA_T: tl.constexpr,
    CD: tl.constexpr,
):
    """The distribution: probs_i = [kept_i] e^(x_i - M) / Z_f; one-hot for greedy rows, zeros
    for invalid ones. Grid (B, C) like the statistics kernel; a second read of the logits."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lrow = logits_ptr + row * stride_lb
    erow = edits_ptr + row * stride_eb
    brow = bnd_ptr + row * 2 * NT
    xrow = x_ptr + row * stride_xb
    prow = probs_ptr + row * stride_pb
    arow = am_ptr + row * stride_ab
    la = _param(la_ptr, la_s, row, LA_T)
    beta = _param(beta_ptr, beta_s, row, BETA_T)
    Me = tl.load(sf_ptr + row * NS + S_ME)
    T, rep, pres, freq, tdiv = _row_scale(
        temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
        TEMP_T, REP_T, PRES_T, FREQ_T)
    lminp = _param(minp_ptr, minp_s, row, MINP_T)
    if not HAS_MINP:
        lminp = tl.full([], float("-inf"), tl.float32)
    M = tl.load(sf_ptr + row * NS + S_M)
    tau = tl.load(sf_ptr + row * NS + S_TAU)
    inv_z = _reciprocal(tl.load(sf_ptr + row * NS + S_ZF))  # 1 / Z exact, no div.rn call
    xpmax = tl.load(sf_ptr + row * NS + S_XPMAX)
    flags = tl.load(si_ptr + row * 2)
    gidx = tl.load(si_ptr + row * 2 + 1).to(tl.int64)
    valid = (flags & 1) != 0
    sampling = (flags & 2) != 0
    ovf = (flags & 4) != 0
    t_end = tl.minimum(c * TPC + TPC, NT)
    for t in range(c * TPC, t_end):
        offs = t * TILE + tl.arange(0, TILE)
        inb = offs < V
        if sampling:
            offs, inb, xp, _, _, _ = _penalised_tile(
                lrow, erow, brow, xrow, NT, t, V, rep, pres, freq,
                TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK,
                HAS_BIAS,
                arow, la, beta, Me, CD, False)
            x = _tempered(xp, tdiv, ovf, xpmax)
            e = tl.exp(x - M)
            keep = (x >= tau) & (x - M >= lminp)
            pr = tl.where(keep, e * inv_z, 0.0)
        else:
            pr = tl.where(valid & (offs == gidx), 1.0, 0.0)
        tl.store(prow + offs, pr, mask=inb)
