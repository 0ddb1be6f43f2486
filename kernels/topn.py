"""Top-N logprobs from the one read (``sample(..., top_logprobs=N)``): per block its N best
tokens, per row the N best of those and their logprobs.

Order: the mode's value descending, the lowest id first among equal values:

    raw        l, the logits as given (fp32)       logprob = (l - RM) - log RZ
    processed  xp, the penalised logits (before T)  logprob = (x - M) - log Z_f on the kept set,
                                                    x = xp / T; past the kept set (-1, -inf)

RM = max finite l, RZ = sum e^(l - RM); M, Z_f and the kept set are the sampler's own (the merge
leaves them per row, as for the distribution): the drawn token's entry is its logprob, bit for
bit. Every filter keeps an upper set of x, and x is monotone in xp, so the kept tokens are a
prefix of the processed order.

Stage 1 (kernels/stats.py, TOPN > 0), per block t: the block's KB = min(NTOP, TILE) best packed
keys (``_top_key``: the value's order key over the token id, one int64; ``tl.topk`` is a bitonic
selection, exact with its ties) and, raw, rm_t, rz_t and the count of NaN / +inf logits. The
block's N best hold every token of the row's N best that lies in it, so the union of the
blocks' lists holds the row's N best. ``_top_n_kernel``, grid (B,), reduces the lists in groups
of blocks to a running top and the raw partials as vectors over the block index (a fixed tree:
the same for any chunk count and batch).

No pass over the logits: stage 1 adds 8 KB (+ 12, raw) bytes of writes per block (a 1024-token
block: 4 KB of fp32 logits read, 256 B written at N = 20); the row kernel reads them back.
"""
import triton
import triton.language as tl

from .common import (EMPTY_SLOT, NS, S_M, S_TAU, S_XPMAX, S_ZF, _cand_id, _cand_x, _key, _param,
                     _tempered)

EMPTY_KEY = tl.constexpr(-(2 ** 63))   # no token: below every packed key
# raw per-block partials (float32 [B, NRAW, NT]): max, sum, NaN / +inf count, candidates, g
RAW_M, RAW_Z, RAW_BAD, RAW_N, RAW_G = (tl.constexpr(i) for i in range(5))
NRAW = tl.constexpr(5)


@triton.jit
def _top_key(v, ids):
    """One int64 per token, larger = earlier: v's order key, then the lower id. v + 0 makes
    -0.0 +0.0 (the key orders the bits, -0 < +0): equal logits, the lower id first."""
    low = (0xFFFFFFFF - ids.to(tl.int64))  # in [0, 2^32): the lower id, the larger
    return (_key(v + 0.0).to(tl.int64) << 32) | low


@triton.jit
def _top_unkey(k):
    """(value, id) of packed keys (_key is an involution on the order key's bits)."""
    hi = (k >> 32).to(tl.int32)
    v = (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return v, (0xFFFFFFFF - (k & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def _block_top(v, offs, inb, topw_ptr, row, NT, t, KB: tl.constexpr):
    """Block t's KB best (value, id) keys, best first; NaN lanes and padding are no token."""
    key = tl.where(inb & (v == v), _top_key(v, offs), EMPTY_KEY)
    tl.store(topw_ptr + (row * NT + t) * KB + tl.arange(0, KB), tl.topk(key, KB))


@triton.jit
def _block_raw(raw, inb, rs_ptr, row, NT, t):
    """Block t's raw partials (max finite l, sum e^(l - max), count of NaN / +inf); returns
    (the finite logits, -inf elsewhere; their max) for the block's raw candidates."""
    rv = tl.where(inb & (tl.abs(raw) < float("inf")), raw, float("-inf"))
    rm = tl.max(rv, axis=0)
    rz = tl.sum(tl.where(rv > float("-inf"), tl.exp(rv - rm), 0.0), axis=0)
    bad = tl.sum((inb & ((raw != raw) | (raw == float("inf")))).to(tl.float32), axis=0)
    base = rs_ptr + row * NRAW * NT + t
    tl.store(base + RAW_M * NT, rm)
    tl.store(base + RAW_Z * NT, rz)
    tl.store(base + RAW_BAD * NT, bad)
    return rv, rm


@triton.jit
def _block_raw_cands(rs_ptr, row, NT, t, ncand, g):
    """How many raw candidates block t stored, and its largest finite logit not stored."""
    base = rs_ptr + row * NRAW * NT + t
    tl.store(base + RAW_N * NT, ncand.to(tl.float32))
    tl.store(base + RAW_G * NT, g)


@triton.jit
def _row_top(topw_ptr, row, NT, KB: tl.constexpr, NSEL: tl.constexpr, GB: tl.constexpr):
    """The row's NSEL best keys, best first: a running top over groups of GB blocks."""
    best = tl.full([NSEL], EMPTY_KEY, tl.int64)
    for g0 in range(0, NT, GB):
        blk = g0 + tl.arange(0, GB)
        slot = (row * NT + blk.to(tl.int64))[:, None] * KB + tl.arange(0, KB)[None, :]
        keys = tl.load(topw_ptr + slot, mask=(blk < NT)[:, None], other=EMPTY_KEY)
        group = tl.topk(tl.reshape(keys, [GB * KB]), NSEL)
        best = tl.topk(tl.reshape(tl.join(best, group), [2 * NSEL]), NSEL)
    return best


@triton.jit
def _raw_row_top(topw_ptr, rs_ptr, row, NT, N, KB: tl.constexpr, NSEL: tl.constexpr,
                 CB: tl.constexpr, NT_P2: tl.constexpr):
    """The row's NSEL best raw keys from the blocks' candidates, and whether they are exact.

    A lower bound on the N-th largest logit: the N-th largest block max (N blocks reach it).
    Only the blocks whose max reaches it are visited (about N of them), their candidates >= it
    kept. Exact when the N-th key found beats G, the largest logit any block left out (every
    logit > G is a candidate), or when no block left one out."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    base = rs_ptr + row * NRAW * NT
    m_t = tl.load(base + RAW_M * NT + tt, mask=tin, other=float("-inf"))
    n_t = tl.load(base + RAW_N * NT + tt, mask=tin, other=0.0).to(tl.int32)
    G = tl.max(tl.load(base + RAW_G * NT + tt, mask=tin, other=float("-inf")), axis=0)
    LB = tl.max(tl.where(tt == N - 1, tl.sort(m_t, descending=True), float("-inf")), axis=0)
    reach = tin & (m_t >= LB) & (m_t > float("-inf"))
    nreach = tl.sum(reach.to(tl.int32), axis=0)
    order = tl.sort(tl.where(reach, tt, NT_P2 + tt))
    best = tl.full([NSEL], EMPTY_KEY, tl.int64)
    for b0 in range(0, nreach * KB, CB):
        lane = b0 + tl.arange(0, CB)
        blk = tl.gather(order, tl.minimum(lane // KB, NT_P2 - 1), 0)
        ok = (lane < nreach * KB) & (lane % KB < tl.gather(n_t, tl.minimum(blk, NT_P2 - 1), 0))
        v = tl.load(topw_ptr + (row * NT + blk.to(tl.int64)) * KB + lane % KB, mask=ok,
                    other=EMPTY_SLOT)
        x = _cand_x(v)
        key = tl.where(ok & (x >= LB), _top_key(x, _cand_id(v)), EMPTY_KEY)
        best = tl.topk(tl.reshape(tl.join(best, tl.topk(key, NSEL)), [2 * NSEL]), NSEL)
    v_n, _ = _top_unkey(tl.max(tl.where(tl.arange(0, NSEL) == N - 1, best, EMPTY_KEY), axis=0))
    nth = tl.max(tl.where(tl.arange(0, NSEL) == N - 1, best, EMPTY_KEY), axis=0) != EMPTY_KEY
    return best, (G == float("-inf")) | (nth & (v_n > G))


@triton.jit
def _raw_row_pass(logits_ptr, stride_lb, V, row, NT, NSEL: tl.constexpr, TILE: tl.constexpr):
    """The row's NSEL best raw keys from its logits (one more read): rows whose candidates did
    not prove their N best (many logits tied near a block's max)."""
    best = tl.full([NSEL], EMPTY_KEY, tl.int64)
    lrow = logits_ptr + row * stride_lb
    for t in range(0, NT):
        start = tl.cast(t, tl.int64) * TILE
        lane = tl.arange(0, TILE)
        inb = lane < (V - start).to(tl.int32)
        raw = tl.load(lrow + start + lane, mask=inb, other=float("-inf")).to(tl.float32)
        key = tl.where(inb & (tl.abs(raw) < float("inf")),
                       _top_key(raw, start.to(tl.int32) + lane), EMPTY_KEY)
        best = tl.topk(tl.reshape(tl.join(best, tl.topk(key, NSEL)), [2 * NSEL]), NSEL)
    return best


@triton.jit
def _raw_logprobs(rs_ptr, row, NT, v, NT_P2: tl.constexpr):
    """(l - RM) - log RZ for the values v; NaN everywhere in a row holding a NaN or +inf."""
    tt = tl.arange(0, NT_P2)
    tin = tt < NT
    base = rs_ptr + row * NRAW * NT
    rm = tl.load(base + RAW_M * NT + tt, mask=tin, other=float("-inf"))
    rz = tl.load(base + RAW_Z * NT + tt, mask=tin, other=0.0)
    bad = tl.sum(tl.load(base + RAW_BAD * NT + tt, mask=tin, other=0.0), axis=0)
    RM = tl.max(rm, axis=0)
    RZ = tl.sum(tl.where(rm > float("-inf"), rz * tl.exp(rm - RM), 0.0), axis=0)
    return tl.where(bad > 0.0, float("nan"), (v - RM) - tl.log(RZ)), bad > 0.0


@triton.jit
def _processed_logprobs(sf_ptr, si_ptr, row, v, ids, nsel, tdiv, lminp):
    """(ids, logprobs) under the distribution the row was sampled from: (x - M) - log Z_f on
    its kept set, in the sampler's arithmetic; a greedy row's argmax first (0.0); the rest, and
    every place of an invalid row, (-1, -inf)."""
    M = tl.load(sf_ptr + row * NS + S_M)
    tau = tl.load(sf_ptr + row * NS + S_TAU)
    z_f = tl.load(sf_ptr + row * NS + S_ZF)
    xpmax = tl.load(sf_ptr + row * NS + S_XPMAX)
    flags = tl.load(si_ptr + row * 2)
    gidx = tl.load(si_ptr + row * 2 + 1)
    valid = (flags & 1) != 0
    sampling = (flags & 2) != 0
    x = _tempered(v, tdiv, (flags & 4) != 0, xpmax)
    # a -inf token is never kept (no mass; tau and the min-p cut can both be -inf)
    keep = sampling & (ids >= 0) & (x > float("-inf")) & (x >= tau) & (x - M >= lminp)
    lp = tl.where(keep, (x - M) - tl.log(z_f), float("-inf"))
    out = tl.where(keep, ids, -1)
    first = tl.arange(0, nsel) == 0
    greedy = valid & (~sampling)
    lp = tl.where(greedy, tl.where(first, 0.0, float("-inf")), lp)
    out = tl.where(greedy, tl.where(first, gidx, -1), out)
    return out, lp


@triton.jit(do_not_specialize=["N", "stride_lb"])
def _top_n_kernel(
    logits_ptr, stride_lb, V, topw_ptr, rs_ptr, sf_ptr, si_ptr, temp_ptr, temp_s,
    minp_ptr, minp_s, ids_ptr, lp_ptr, NT, N,
    TEMP_T: tl.constexpr, MINP_T: tl.constexpr, HAS_MINP: tl.constexpr, RAW: tl.constexpr,
    KB: tl.constexpr, NSEL: tl.constexpr, GB: tl.constexpr, CB: tl.constexpr,
    NT_P2: tl.constexpr, TILE: tl.constexpr,
):
    """Grid (B,). Raw: reads the candidates of the ~N blocks whose max reaches the N-th
    largest block max (and 20 bytes per block), the logits only for a row whose candidates do
    not prove its N best; processed: the row's NT * KB keys and the merge's row state. Writes
    N ids (int64) and logprobs (float32); places past the row's tokens are (-1, -inf)."""
    row = tl.program_id(0).to(tl.int64)
    if RAW:
        best, exact = _raw_row_top(topw_ptr, rs_ptr, row, NT, N, KB, NSEL, CB, NT_P2)
        if not exact:
            best = _raw_row_pass(logits_ptr, stride_lb, V, row, NT, NSEL, TILE)
    else:
        best = _row_top(topw_ptr, row, NT, KB, NSEL, GB)
    v, ids = _top_unkey(best)
    ids = tl.where(best == EMPTY_KEY, -1, ids)
    if RAW:
        lp, bad = _raw_logprobs(rs_ptr, row, NT, v, NT_P2)
        lp = tl.where(ids < 0, float("-inf"), lp)
        ids = tl.where(bad, -1, ids)
        lp = tl.where(bad, float("nan"), lp)
    else:
        T = _param(temp_ptr, temp_s, row, TEMP_T)
        lminp = tl.full([], float("-inf"), tl.float32)
        if HAS_MINP:
            lminp = _param(minp_ptr, minp_s, row, MINP_T)
        ids, lp = _processed_logprobs(sf_ptr, si_ptr, row, v, ids, NSEL, T, lminp)
    j = tl.arange(0, NSEL)
    tl.store(ids_ptr + row * N + j, ids.to(tl.int64), mask=j < N)
    tl.store(lp_ptr + row * N + j, lp, mask=j < N)
