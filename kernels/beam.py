"""Fused beam-search step: log-softmax normaliser and a row's best K candidates in one pass.

One program owns one beam row of the [N, V] logits (N = batch * num_beams) and walks it in
TILE-wide tiles. Nothing of size V is written: the row's state is (M, Z) of the online
log-sum-exp and one or two K-slot candidate buffers in registers.

Notation for one row (fp32):
    x       raw logits (normaliser source)
    c       candidate logits: x, or -inf where the candidates tensor is -inf (transformers' mask
            processors applied to a copy: no_repeat_ngram, bad_words, min_length only write -inf)
    lp      (c - M) - log Z                      log_softmax, transformers' order
    v       a * lp / T, a = penalty if the token is in the history else 1
            (RepetitionPenaltyLogitsProcessor on log-probs: lp <= 0, so it multiplies)
    key     v (beam search) or v + Gumbel(seed, offset, id) (beam sampling: Gumbel top-K is
            sampling K without replacement, what torch.multinomial(softmax) does)
Output: the K largest keys, sorted (key desc, id asc), with v and the ids.
"""
import os

import torch
import triton
import triton.language as tl

from .common import _gumbel, _quotient, _row_key
from .launch import exact_fp, next_pow2

# Sentinel ids (empty / disabled slots): larger than any token id.
BIG_ID = tl.constexpr(1 << 62)


@triton.jit
def _insert_tile(bk, bc, bi, tk, tc, ti, BIG: tl.constexpr):
    """Merge a tile (keys tk, candidate logits tc, ids ti) into the K-slot buffer.

    Order: key desc, then id asc. Each round moves the tile's best entry over the buffer's
    worst while it beats it, so a tile costs one round once the buffer holds the row's
    leaders (the common case after the first tiles).
    """
    alive = ti >= 0
    go = tl.full([], 1, tl.int1)
    while go:
        wk = tl.min(bk, axis=0)
        wi = tl.max(tl.where(bk == wk, bi, -1), axis=0)
        m = tl.max(tl.where(alive, tk, float("-inf")), axis=0)
        mi = tl.min(tl.where(alive & (tk == m), ti, BIG), axis=0)
        go = (mi < BIG) & ((m > wk) | ((m == wk) & (mi < wi)))
        mc = tl.max(tl.where(ti == mi, tc, float("-inf")), axis=0)
        slot = go & (bk == wk) & (bi == wi)
        bk = tl.where(slot, m, bk)
        bc = tl.where(slot, mc, bc)
        bi = tl.where(slot, mi, bi)
        alive = alive & ~(go & (ti == mi))
    return bk, bc, bi


@triton.jit
def _final_keys(bc, bi, M, logz, a, T, k0, k1, NORMALIZE: tl.constexpr, HAS_NOISE: tl.constexpr):
    """(v, key) of buffered candidates once the normaliser is known."""
    v = bc
    if NORMALIZE:
        v = _quotient(a * ((bc - M) - logz), T)
    key = v
    if HAS_NOISE:
        key = v + _gumbel(k0, k1, tl.where(bi >= 0, bi, 0))
    return v, key


@triton.jit
def _seen_tile(irow, L, start, TILE: tl.constexpr, L_BLOCK: tl.constexpr):
    """Which of the tile's TILE tokens (ids start ..) occur in the row's history irow [L]
    (negative ids are ignored)."""
    seen = tl.zeros([TILE], dtype=tl.int32)
    for h0 in range(0, L, L_BLOCK):
        hoffs = h0 + tl.arange(0, L_BLOCK)
        hin = hoffs < L
        hid = tl.load(irow + hoffs, mask=hin, other=-1).to(tl.int64)
        rel = hid - start
        inwin = hin & (rel >= 0) & (rel < TILE)
        seen += tl.histogram(tl.where(inwin, rel, 0).to(tl.int32), TILE, mask=inwin)
    return seen > 0


@triton.jit
def _beam_pass(lrow, crow, irow, V, L, rep, temp, k0, k1, K: tl.constexpr, KP: tl.constexpr,
               NORMALIZE: tl.constexpr, HAS_CAND: tl.constexpr, HAS_REP: tl.constexpr,
               HAS_NOISE: tl.constexpr, TILE: tl.constexpr, L_BLOCK: tl.constexpr):
    """The row's one pass: (M, Z) of the online log-sum-exp and the two K-slot buffers (key, c,
    id) of the tokens outside / inside the history (only the first with HAS_REP off), ranked
    by the partial key a c / T (+ Gumbel)."""
    slots = tl.arange(0, KP)
    # Slots >= K are disabled: a +inf key is never the worst, so they are never replaced.
    init_k = tl.where(slots < K, float("-inf"), float("inf"))
    init_i = tl.where(slots < K, BIG_ID + slots.to(tl.int64), -1)
    uk = init_k
    uc = tl.zeros([KP], tl.float32)
    ui = init_i
    sk = init_k
    sc = tl.zeros([KP], tl.float32)
    si = init_i
    M = tl.full([], float("-inf"), tl.float32)
    Z = tl.zeros([], tl.float32)
    for start in range(0, V, TILE):
        offs = start + tl.arange(0, TILE).to(tl.int64)
        inb = offs < V
        x = tl.load(lrow + offs, mask=inb, other=float("-inf")).to(tl.float32)
        if NORMALIZE:
            new_m = tl.maximum(M, tl.max(x, axis=0))
            scale = tl.where(M == new_m, 1.0, tl.exp(M - new_m))
            # a NaN lane adds NaN (max ignores it), a +inf one exp(inf - inf): Z is NaN
            # exactly on a row whose log_softmax is (transformers' values: NaN throughout)
            Z = Z * scale + tl.sum(tl.where(x > float("-inf"), tl.exp(x - new_m),
                                            tl.where(x == x, 0.0, x)), axis=0)
            M = new_m
        c = x
        if HAS_CAND:
            cm = tl.load(crow + offs, mask=inb, other=float("-inf")).to(tl.float32)
            c = tl.where(cm == float("-inf"), float("-inf"), x)
        g = tl.zeros([TILE], tl.float32)
        if HAS_NOISE:
            g = _gumbel(k0, k1, offs)
        ids = tl.where(inb, offs, -1)
        if HAS_REP:
            is_seen = _seen_tile(irow, L, start, TILE, L_BLOCK)
            uk, uc, ui = _insert_tile(uk, uc, ui, _quotient(c, temp) + g, c,
                                      tl.where(is_seen, -1, ids), BIG_ID)
            sk, sc, si = _insert_tile(sk, sc, si, _quotient(rep * c, temp) + g, c,
                                      tl.where(is_seen, ids, -1), BIG_ID)
        else:
            uk, uc, ui = _insert_tile(uk, uc, ui, _quotient(c, temp) + g, c, ids, BIG_ID)
    return M, Z, uk, uc, ui, sk, sc, si


@triton.jit
def _buffer_keys(bc, bi, M, logz, a, temp, k0, k1, OFF: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_NOISE: tl.constexpr):
    """A buffer's final (v, key, id): slots that hold no real token get key -inf and a
    sentinel id (BIG_ID + OFF + slot) that no other slot shares."""
    slots = tl.arange(0, KP)
    v, key = _final_keys(bc, bi, M, logz, a, temp, k0, k1, NORMALIZE, HAS_NOISE)
    real = (slots < K) & (bi >= 0) & (bi < BIG_ID)
    key = tl.where(real, key, float("-inf"))
    return v, key, tl.where(real, bi, BIG_ID + OFF + slots.to(tl.int64))


@triton.jit
def _write_sorted(val_ptr, key_ptr, tok_ptr, orow, Z, uv, uk, ui, sv, sk, si, K: tl.constexpr,
                  KP: tl.constexpr, HAS_REP: tl.constexpr):
    """K rounds of "take the best left" over the one or two buffers, written sorted (key
    desc, id asc). A row with fewer than K real candidates reports id 0 with -inf (never
    selected while the batch item has K finite candidates). A row holding NaN or +inf
    (normalize: Z is NaN) reports NaN values and keys, ids 0 .. K - 1, as the twin
    (beam_topk_reference): no finite-looking answer."""
    for j in range(K):
        m = tl.max(uk, axis=0)
        mi = tl.min(tl.where(uk == m, ui, BIG_ID + 4 * KP), axis=0)
        mv = tl.max(tl.where((uk == m) & (ui == mi), uv, float("-inf")), axis=0)
        from_s = tl.zeros([], tl.int1)
        if HAS_REP:
            ms = tl.max(sk, axis=0)
            msi = tl.min(tl.where(sk == ms, si, BIG_ID + 4 * KP), axis=0)
            msv = tl.max(tl.where((sk == ms) & (si == msi), sv, float("-inf")), axis=0)
            from_s = (ms > m) | ((ms == m) & (msi < mi))
            m = tl.where(from_s, ms, m)
            mv = tl.where(from_s, msv, mv)
            mi = tl.where(from_s, msi, mi)
            # (ids are never negative here: -7 matches nothing)
            took_s = si == tl.where(from_s, msi, -7)
            sk = tl.where(took_s, float("-inf"), sk)
            si = tl.where(took_s, BIG_ID + 3 * KP, si)
        took_u = ui == tl.where(from_s, -7, mi)
        uk = tl.where(took_u, float("-inf"), uk)
        ui = tl.where(took_u, BIG_ID + 3 * KP, ui)
        real = mi < BIG_ID
        tl.store(val_ptr + orow + j, tl.where(Z != Z, Z, tl.where(real, mv, float("-inf"))))
        tl.store(key_ptr + orow + j, tl.where(Z != Z, Z, tl.where(real, m, float("-inf"))))
        tl.store(tok_ptr + orow + j, tl.where(Z != Z, j, tl.where(real, mi, 0)))


@triton.jit(do_not_specialize=["L", "off_s"])
def _beam_step_kernel(
    logits_ptr, stride_lb, cand_ptr, stride_cb, V,
    ids_ptr, stride_ib, L,
    rep, temp, seed_ptr, off_s,
    val_ptr, key_ptr, tok_ptr, stride_ob,
    K: tl.constexpr, KP: tl.constexpr,
    NORMALIZE: tl.constexpr, HAS_CAND: tl.constexpr, HAS_REP: tl.constexpr,
    HAS_NOISE: tl.constexpr, TILE: tl.constexpr, L_BLOCK: tl.constexpr,
):
    """Top-K beam candidates of one row.

    Math: see the module docstring. One pass over the row reads V * dtype_bytes of logits
    (plus V * 4 of candidates when HAS_CAND, plus L * 8 bytes of history ids per tile when
    HAS_REP) and keeps (M, Z) online. Because lp = c - const, the order inside a group of
    tokens that share `a` is the order of a * c / T (+ Gumbel): the pass ranks by that
    partial key, one buffer per group (seen / unseen history tokens), and the final keys are
    formed and merged after the pass. Writes K floats v, K keys, K int64 ids per row.
    """
    row = tl.program_id(0).to(tl.int64)
    k0 = tl.zeros([], tl.uint32)
    k1 = tl.zeros([], tl.uint32)
    if HAS_NOISE:
        # the draw's key (common._row_key): a seed per row, the call's offset
        k0, k1 = _row_key(seed_ptr, 0, seed_ptr, off_s, row, True, False)
    M, Z, uk, uc, ui, sk, sc, si = _beam_pass(
        logits_ptr + row * stride_lb, cand_ptr + row * stride_cb, ids_ptr + row * stride_ib, V,
        L, rep, temp, k0, k1, K, KP, NORMALIZE, HAS_CAND, HAS_REP, HAS_NOISE, TILE, L_BLOCK)
    logz = tl.zeros([], tl.float32)
    if NORMALIZE:
        logz = tl.log(Z)
    uv, uk, ui = _buffer_keys(uc, ui, M, logz, 1.0, temp, k0, k1, 0, K, KP, NORMALIZE,
                              HAS_NOISE)
    sv = uv
    if HAS_REP:
        sv, sk, si = _buffer_keys(sc, si, M, logz, rep, temp, k0, k1, KP, K, KP, NORMALIZE,
                                  HAS_NOISE)
    _write_sorted(val_ptr, key_ptr, tok_ptr, row * stride_ob, Z, uv, uk, ui, sv, sk, si, K, KP,
                  HAS_REP)


def beam_topk(logits, k, *, candidates=None, normalize=True, repetition_penalty=1.0,
              temperature=1.0, input_ids=None, seed=None, offset=0, tile=None, num_warps=None):
    """Launch ``_beam_step_kernel`` over the rows of ``logits`` [N, V].

    Arguments are validated by the public layer (gpu_sampler.beam.beam_topk): ``candidates``
    None or float [N, V]; ``input_ids`` None or int64 [N, L] (negative ids are ignored);
    ``seed`` None or int64 [N] (Gumbel keys). Returns (values float32 [N, k], keys float32
    [N, k], ids int64 [N, k]) sorted by key desc, id asc.
    """
    N, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if tile is None:
        tile = min(next_pow2(V), 256 if interp else 1024)
    tile = max(16, tile)
    has_cand = candidates is not None
    cand = candidates.contiguous() if has_cand else logits
    has_rep = input_ids is not None and input_ids.shape[1] > 0 and repetition_penalty != 1.0
    if has_rep:
        ids = input_ids.contiguous()
        L, stride_ib = ids.shape[1], ids.stride(0)
    else:
        ids, L, stride_ib = logits, 0, 0
    vals = torch.empty((N, k), dtype=torch.float32, device=dev)
    keys = torch.empty((N, k), dtype=torch.float32, device=dev)
    toks = torch.empty((N, k), dtype=torch.int64, device=dev)
    if N == 0:
        return vals, keys, toks
    has_noise = seed is not None
    _beam_step_kernel[(N,)](
        logits, logits.stride(0), cand, cand.stride(0), V,
        ids, stride_ib, L,
        float(repetition_penalty), float(temperature),
        seed if has_noise else logits, int(offset),
        vals, keys, toks, k,
        K=k, KP=next_pow2(max(k, 2)),
        NORMALIZE=normalize, HAS_CAND=has_cand, HAS_REP=has_rep, HAS_NOISE=has_noise,
        TILE=tile, L_BLOCK=min(max(16, next_pow2(L)), 1024),
        num_warps=num_warps or (8 if tile >= 1024 else 4), **exact_fp(),
    )
    return vals, keys, toks


def compile_beam_step(arch=90, num_warps=8, K=8, **flags):
    """Compile one constexpr variant of ``_beam_step_kernel`` for a CUDA target without a GPU
    (the real Triton pipeline down to a cubin; TRITON_INTERPRET must be unset)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET to compile (the interpreter is active)")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"logits_ptr": "*fp32", "cand_ptr": "*fp32", "ids_ptr": "*i64", "seed_ptr": "*i64",
            "val_ptr": "*fp32", "key_ptr": "*fp32", "tok_ptr": "*i64"}
    consts = dict(K=K, KP=next_pow2(max(K, 2)), TILE=1024, L_BLOCK=128, NORMALIZE=True,
                  HAS_CAND=True, HAS_REP=True, HAS_NOISE=True)
    consts.update(flags)
    sig, constexprs = {}, {}
    for i, name in enumerate(_beam_step_kernel.arg_names):
        if name in ptrs:
            sig[name] = ptrs[name]
        elif name in consts:
            sig[name], constexprs[(i,)] = "constexpr", consts[name]
        else:
            sig[name] = {"rep": "fp32", "temp": "fp32", "L": "i64", "off_s": "i64"}.get(name, "i32")
    src = ASTSource(fn=_beam_step_kernel, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
