"""Speculative verification against draft distributions: p_i(d_i) and the residual draw, after
the merge, with no [R, V] distribution in memory.

speculative_sample (gpu_sampler/speculative.py) lays the B (K + 1) target positions out as R
sampling rows (row r = b (K + 1) + i) and runs stage 1 and the merge in distribution mode: each
row ends with its state (M, tau, Z_f, flags) and, when its kept set lies inside the merge's
compacted candidate list, that list's length (``nl``, in the greedy-token slot of its flags;
-1 otherwise). Then, per row, with
q = draft_probs[b, i] (q = 0 at the bonus position i = K) and d = draft_tokens[b, i]:

    p_v   = [kept_v] e^(x_v - M) / Z_f           (kept_v: x_v >= tau and x_v - M >= ln min_p)
    r_v   = max(0, p_v - q_v)                     R = sum_v r_v
    token = argmax_v log r_v + G_v  (r_v > 0)     if R > 0,   else  argmax_v log p_v + G_v
    p_d   = p_d(row),  logprob = log p_token

with G_v position i's per-token Gumbel noise (lowest id on ties): the residual draw of the
rejection rule and, at i = K, the bonus draw over p_K, the arithmetic of the torch twin's
``_residual_draw`` per token. q is gathered at kept tokens only, never read whole.

    _residual_kernel  grid (R, C') a list row (kept set in the merge's list): program 0 scans
                                   the list (from L2, no logits) and writes the outputs, as
                                   for a greedy or invalid row; any other row (pure
                                   temperature, min-p alone, a row pass): each program reads
                                   its blocks of the logits once more, one partial. SOLO
                                   (no row of the call can be pure or min-p alone): grid
                                   (R,), the program reads the whole row and writes outputs
    _residual_finish  grid (R,)    (not with SOLO) reduces those rows' C' partials

Passes over the logits: 1 (stage 1) for rows decided on the candidates (bounded top-k, and most
top-p / min-p rows), 2 for the others; the list scan reads ~n_list * 8 bytes of L2 and q at the
kept tokens.
"""
import triton
import triton.language as tl

from .common import (NO_ID, NS, S_M, S_ME, S_TAU, S_XPMAX, S_ZF, _best, _better, _gumbel,
                     _param, _penalised_tile, _reciprocal, _row_key, _row_scale, _tempered)

# per-program partials of a row read again (float32 [R, NP, NT], int32 [R, NPI, NT]; C <= NT)
P_RM, P_RS, P_RP, P_PS, P_PP, P_PD = (tl.constexpr(i) for i in range(6))
NP = tl.constexpr(6)
P_RID, P_PID = (tl.constexpr(i) for i in range(2))
NPI = tl.constexpr(2)


@triton.jit
def _scores(x, ids, ok, M, tau, lminp, inv_z, qrow, d, k0, k1):
    """Per token: (r, p, residual score, plain score, p where the token is d) over ``ok``
    tokens; q_v = 0 where d < 0 (the bonus position)."""
    e = tl.exp(x - M)
    kept = ok & (x >= tau) & (x - M >= lminp)
    p = tl.where(kept, e * inv_z, 0.0)
    # d < 0 at the bonus position: q = 0 there (a block compare: the interpreter takes a scalar
    # flag in a load mask as int64)
    q = tl.load(qrow + ids, mask=kept & ((ids * 0 + d) >= 0), other=0.0).to(tl.float32)
    r = tl.maximum(p - q, 0.0)
    g = _gumbel(k0, k1, ids)
    rs = tl.where(r > 0.0, tl.log(r) + g, float("-inf"))
    ps = tl.where(p > 0.0, tl.log(p) + g, float("-inf"))
    return r, p, rs, ps, tl.where(kept & (ids == d), p, 0.0)


@triton.jit
def _emit(tok_ptr, logp_ptr, pd_ptr, row, rm, rid, rp, pid, pp, pd):
    """The row's outputs: the residual token while the residual has mass, else p's."""
    use = rm > 0.0
    tl.store(tok_ptr + row, tl.where(use, rid, pid).to(tl.int64))
    tl.store(logp_ptr + row, tl.log(tl.where(use, rp, pp)))
    tl.store(pd_ptr + row, pd)


@triton.jit
def _store_partial(pf, pi, slot, NT, rm, rb, rid, rp, pb, pid, pp, pd):
    """A partial (residual mass and maximum, plain maximum, p at d) at ``slot`` of the row's."""
    tl.store(pf + P_RM * NT + slot, rm)
    tl.store(pf + P_RS * NT + slot, rb)
    tl.store(pf + P_RP * NT + slot, rp)
    tl.store(pf + P_PS * NT + slot, pb)
    tl.store(pf + P_PP * NT + slot, pp)
    tl.store(pf + P_PD * NT + slot, pd)
    tl.store(pi + P_RID * NT + slot, rid.to(tl.int32))
    tl.store(pi + P_PID * NT + slot, pid.to(tl.int32))


@triton.jit
def _lanes_init(N: tl.constexpr):
    """Per-lane partials (R, p_d sums; residual and plain maxima: score, id, p), empty."""
    zero = tl.zeros([N], tl.float32)
    ninf = tl.full([N], float("-inf"), tl.float32)
    none = tl.full([N], NO_ID, tl.int32)
    return zero, zero, ninf, none, zero, ninf, none, zero


@triton.jit
def _lanes_add(x, ids, ok, M, tau, lminp, inv_z, qrow, d, k0, k1, rm, pd, rb, rid, rp, pb, pid,
               pp):
    """One vector of tokens into the per-lane partials (no cross-lane reduction)."""
    r, p, rs, ps, pd_v = _scores(x, ids, ok, M, tau, lminp, inv_z, qrow, d, k0, k1)
    rb, rid, rp = _better(rs, ids, p, rb, rid, rp)
    pb, pid, pp = _better(ps, ids, p, pb, pid, pp)
    return rm + r, pd + pd_v, rb, rid, rp, pb, pid, pp


@triton.jit
def _lanes_result(rm, pd, rb, rid, rp, pb, pid, pp):
    """The per-lane partials reduced once: (R, residual max (score, id, p), plain max, p_d)."""
    rb1, rid1, rp1 = _best(rb, rid, rp)
    pb1, pid1, pp1 = _best(pb, pid, pp)
    return tl.sum(rm, axis=0), rb1, rid1, rp1, pb1, pid1, pp1, tl.sum(pd, axis=0)


@triton.jit
def _list_part(xs_ptr, is_ptr, base, lo, hi, M, tau, lminp, inv_z, qrow, d, k0, k1,
               LB: tl.constexpr):
    """The partial of list entries [lo, hi): (R, residual max (score, id, p), plain max,
    p_d). Per-lane maxima and sums, reduced once at the end: an iteration is two dependent
    loads and arithmetic, no cross-lane reduction (a long list, e.g. a wide nucleus, is one
    program's loop)."""
    rm, pd, rb, rid, rp, pb, pid, pp = _lanes_init(LB)
    for b0 in range(lo, hi, LB):
        idx = b0 + tl.arange(0, LB)
        ok = idx < hi
        x = tl.load(xs_ptr + base + idx, mask=ok, other=float("-inf"))
        ids = tl.load(is_ptr + base + idx, mask=ok, other=0)
        rm, pd, rb, rid, rp, pb, pid, pp = _lanes_add(x, ids, ok, M, tau, lminp, inv_z, qrow, d,
                                                      k0, k1, rm, pd, rb, rid, rp, pb, pid, pp)
    return _lanes_result(rm, pd, rb, rid, rp, pb, pid, pp)


@triton.jit(do_not_specialize=["TPC", "stride_lb", "seed_s", "off_s"])
def _residual_kernel(
    logits_ptr, stride_lb, V, NT, TPC,
    edits_ptr, stride_eb, bnd_ptr, x_ptr, stride_xb,
    temp_ptr, temp_s, minp_ptr, minp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    seed_ptr, seed_s, off_ptr, off_s,
    sf_ptr, si_ptr, xs_ptr, is_ptr, KT,
    q_ptr, stride_qb, stride_qk, d_ptr, stride_db, K1,
    pf_ptr, pi_ptr, tok_ptr, logp_ptr, pd_ptr,
    am_ptr, stride_ab, la_ptr, la_s, beta_ptr, beta_s,
    TEMP_T: tl.constexpr, MINP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr,
    FREQ_T: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr, HAS_MINP: tl.constexpr,
    HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr, TILE: tl.constexpr, E_BLOCK: tl.constexpr, LA_T: tl.constexpr,
    BETA_T: tl.constexpr, CD: tl.constexpr, LB: tl.constexpr, SOLO: tl.constexpr,
):
    """Grid (R, C) (module docstring). Reads the row state (9 words), then: a list row's
    program 0 the list (8-byte entries) and q at its kept tokens, and writes the outputs; a row
    read again, its blocks [c TPC, (c + 1) TPC) once (V * s bytes per row in all, + q at kept
    tokens), one partial (slot c); greedy and invalid rows: program 0 writes the outputs.
    SOLO (grid (R, 1), TPC = NT: no row of the call can be pure temperature or min-p alone):
    a row read again is read and finished by its one program (rows the merge's row pass
    already read in one program), and _residual_finish is not launched. The result is the
    same for any C: maxima with the lowest id on ties, and R only decides R > 0."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    flags = tl.load(si_ptr + row * 2)
    sampling = (flags & 2) != 0
    nl = tl.load(si_ptr + row * 2 + 1)  # a sampling row's list length, or -1 (the merge)
    i = row % K1
    b = row // K1
    has_q = i < K1 - 1
    j = tl.minimum(i, K1 - 2)
    d = tl.where(has_q, tl.load(d_ptr + b * stride_db + j), -1)
    qrow = q_ptr + b * stride_qb + j * stride_qk
    lminp = tl.full([], float("-inf"), tl.float32)
    if HAS_MINP:
        lminp = _param(minp_ptr, minp_s, row, MINP_T)
    M = tl.load(sf_ptr + row * NS + S_M)
    tau = tl.load(sf_ptr + row * NS + S_TAU)
    inv_z = _reciprocal(tl.load(sf_ptr + row * NS + S_ZF))  # 1 / Z exact, no div.rn call
    k0, k1 = _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T, OFF_T)
    pf = pf_ptr + row * NP * NT
    pi = pi_ptr + row * NPI * NT
    if sampling & (nl < 0):
        rm, rb, rid, rp, pb, pid, pp, pd = _read_part(
            logits_ptr + row * stride_lb, edits_ptr + row * stride_eb, bnd_ptr + row * 2 * NT,
            x_ptr + row * stride_xb, am_ptr + row * stride_ab, la_ptr, la_s, beta_ptr, beta_s,
            temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, sf_ptr, flags,
            row, c * TPC, tl.minimum(c * TPC + TPC, NT), NT, V, M, tau, lminp, inv_z, qrow, d,
            k0, k1, TEMP_T, REP_T, PRES_T, FREQ_T, HAS_REP, HAS_PF, HAS_MASK, HAS_BIAS, TILE,
            E_BLOCK, LA_T, BETA_T, CD)
        if SOLO:
            _emit(tok_ptr, logp_ptr, pd_ptr, row, rm, rid, rp, pid, pp, pd)
        else:
            _store_partial(pf, pi, c, NT, rm, rb, rid, rp, pb, pid, pp, pd)
    elif sampling & (c == 0):
        rm, _, rid, rp, _, pid, pp, pd = _list_part(xs_ptr, is_ptr, row * NT * KT, 0, nl, M,
                                                    tau, lminp, inv_z, qrow, d, k0, k1, LB)
        _emit(tok_ptr, logp_ptr, pd_ptr, row, rm, rid, rp, pid, pp, pd)
    elif c == 0:
        # greedy: p is one-hot at the argmax, the residual too; invalid: -1
        valid = (flags & 1) != 0
        gidx = tl.load(si_ptr + row * 2 + 1).to(tl.int64)
        tl.store(tok_ptr + row, tl.where(valid, gidx, -1))
        tl.store(logp_ptr + row, tl.where(valid, 0.0, float("-inf")))
        tl.store(pd_ptr + row, tl.where(valid & (d == gidx), 1.0, 0.0))


@triton.jit
def _read_part(lrow, erow, brow, xrow, arow, la_ptr, la_s, beta_ptr, beta_s, temp_ptr, temp_s,
               rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, sf_ptr, flags, row, t0, t1,
               NT, V, M, tau, lminp, inv_z, qrow, d, k0, k1,
               TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr,
               FREQ_T: tl.constexpr, HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
               HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, TILE: tl.constexpr,
               E_BLOCK: tl.constexpr, LA_T: tl.constexpr, BETA_T: tl.constexpr,
               CD: tl.constexpr):
    """The partial of blocks [t0, t1), x as _write_probs_kernel computes it: per-lane maxima
    and sums over the blocks, reduced once at the end (as _list_part)."""
    T, rep, pres, freq, tdiv = _row_scale(temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s,
                                          freq_ptr, freq_s, row, TEMP_T, REP_T, PRES_T, FREQ_T)
    la = _param(la_ptr, la_s, row, LA_T)
    beta = _param(beta_ptr, beta_s, row, BETA_T)
    me = tl.load(sf_ptr + row * NS + S_ME)
    ovf = (flags & 4) != 0
    xpmax = tl.load(sf_ptr + row * NS + S_XPMAX)
    rm, pd, rb, rid, rp, pb, pid, pp = _lanes_init(TILE)
    for t in range(t0, t1):
        offs, inb, xp, _, _, _ = _penalised_tile(lrow, erow, brow, xrow, NT, t, V, rep, pres,
                                                 freq, TILE, E_BLOCK, HAS_REP, HAS_PF, HAS_MASK,
                                                 HAS_BIAS, arow, la, beta, me, CD, False)
        x = _tempered(xp, tdiv, ovf, xpmax)
        ids = offs.to(tl.int32)
        rm, pd, rb, rid, rp, pb, pid, pp = _lanes_add(x, ids, inb, M, tau, lminp, inv_z, qrow, d,
                                                      k0, k1, rm, pd, rb, rid, rp, pb, pid, pp)
    return _lanes_result(rm, pd, rb, rid, rp, pb, pid, pp)


@triton.jit
def _residual_finish(si_ptr, pf_ptr, pi_ptr, tok_ptr, logp_ptr, pd_ptr, NT, C,
                     NT_P2: tl.constexpr):
    """Grid (R,). For a row read again: reduces its C partials (8 words each, one per program
    of _residual_kernel; no logits) to the token, its logprob and p_d."""
    row = tl.program_id(0).to(tl.int64)
    sampling = (tl.load(si_ptr + row * 2) & 2) != 0
    if sampling & (tl.load(si_ptr + row * 2 + 1) < 0):
        _reduce_row(pf_ptr + row * NP * NT, pi_ptr + row * NPI * NT, NT, C, tok_ptr, logp_ptr,
                    pd_ptr, row, NT_P2)


@triton.jit
def _reduce_row(pf, pi, NT, n, tok_ptr, logp_ptr, pd_ptr, row, NT_P2: tl.constexpr):
    """The row's outputs from its first n partials (lowest id among equal scores)."""
    tt = tl.arange(0, NT_P2)
    tin = tt < n
    rm = tl.sum(tl.load(pf + P_RM * NT + tt, mask=tin, other=0.0), axis=0)
    pd = tl.sum(tl.load(pf + P_PD * NT + tt, mask=tin, other=0.0), axis=0)
    rs = tl.load(pf + P_RS * NT + tt, mask=tin, other=float("-inf"))
    rid = tl.load(pi + P_RID * NT + tt, mask=tin, other=NO_ID)
    _, rid, rp = _best(rs, rid, tl.load(pf + P_RP * NT + tt, mask=tin, other=0.0))
    ps = tl.load(pf + P_PS * NT + tt, mask=tin, other=float("-inf"))
    pid = tl.load(pi + P_PID * NT + tt, mask=tin, other=NO_ID)
    _, pid, pp = _best(ps, pid, tl.load(pf + P_PP * NT + tt, mask=tin, other=0.0))
    _emit(tok_ptr, logp_ptr, pd_ptr, row, rm, rid, rp, pid, pp, pd)
