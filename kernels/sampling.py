"""Fused sampling kernel: penalties, temperature, top-k, top-p, min-p and the draw in one launch.

One program owns one row of the [B, V] logits and walks it in TILE-wide tiles. Nothing of size V
is written to device memory (except the [B, V] output of ``sampling_distribution``); the row's
state lives in a handful of fp32/int scalars. See ``kernels/README.md`` for the algorithm, the pass
count and the bytes it reads.

Notation for one row (all fp32):
    l       raw logits (any float dtype, upcast on load)
    xp      penalised logits: repetition penalty (HF rule) then presence/frequency (OpenAI rule)
    x       xp / T; a row whose max x overflows (+-inf, max xp not -inf) keeps its max-xp tie
            group, uniformly (the limit T -> 0)
    M, Z    max x and sum exp(x - M) over finite x
    tau     the final threshold: the kept set is {x >= tau} (and exp(x - M) >= min_p)
"""
import os

import torch
import triton
import triton.language as tl

INVALID_TOKEN = -1


@triton.jit
def _param(ptr, scalar, row, IS_TENSOR: tl.constexpr, DTYPE: tl.constexpr = tl.float32):
    """A per-row value from a (B,) tensor, or the call's scalar, as DTYPE."""
    v = tl.cast(scalar, DTYPE)
    if IS_TENSOR:
        v = tl.load(ptr + row).to(DTYPE)
    return v


@triton.jit
def _key(f):
    """Order-preserving map fp32 -> int32 (signed compare on keys = float compare, -0 < +0)."""
    b = f.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _unkey(k):
    b = k ^ ((k >> 31) & 0x7FFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _splitmix64(z):
    z = z + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _uniform(k0, k1, offs):
    """u in (0, 1) from a counter-based hash of (row key, token id); 24 random bits.

    The same function is written in torch in gpu_sampler/rng.py, so the kernel and the torch twin
    draw the same token for the same (seed, offset).
    """
    h = offs.to(tl.uint32) * 0x9E3779B1
    h = _fmix32(h ^ k0)
    h = _fmix32(h ^ k1)
    return ((h >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08


@triton.jit
def _load_tile(lrow_ptr, irow_ptr, L, plen, start, V, rep, pres, freq, tdiv, ovf_row, xp_max,
               TILE: tl.constexpr, L_BLOCK: tl.constexpr,
               HAS_REP: tl.constexpr, HAS_PF: tl.constexpr):
    """One tile of the row: (offsets, in-bounds mask, penalised xp, tempered x).

    Penalties are rebuilt per tile from the history ids with tl.histogram (a count per tile slot),
    so no [V] buffer of penalised logits is ever stored.
    """
    offs = start + tl.arange(0, TILE).to(tl.int64)
    inb = offs < V
    xp = tl.load(lrow_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
    if HAS_REP or HAS_PF:
        seen = tl.zeros([TILE], dtype=tl.int32)
        cnt = tl.zeros([TILE], dtype=tl.int32)
        for h0 in range(0, L, L_BLOCK):
            hoffs = h0 + tl.arange(0, L_BLOCK)
            hin = hoffs < L
            ids = tl.load(irow_ptr + hoffs, mask=hin, other=-1).to(tl.int64)
            rel = ids - start
            inwin = hin & (rel >= 0) & (rel < TILE)
            rel32 = tl.where(inwin, rel, 0).to(tl.int32)
            if HAS_REP:
                seen += tl.histogram(rel32, TILE, mask=inwin)
            if HAS_PF:
                cnt += tl.histogram(rel32, TILE, mask=inwin & (hoffs >= plen))
        if HAS_REP:
            xp = tl.where(seen > 0, tl.where(xp < 0, xp * rep, xp / rep), xp)
        if HAS_PF:
            xp = xp - (tl.where(cnt > 0, pres, 0.0) + freq * cnt.to(tl.float32))
    x = xp / tdiv
    x = tl.where(ovf_row, tl.where(xp == xp_max, 0.0, float("-inf")), x)
    return offs, inb, xp, x


@triton.jit
def _threshold_search(lrow_ptr, irow_ptr, L, plen, V, rep, pres, freq, tdiv, ovf_row, xp_max, M,
                      lo, pv, lo_mass, target,
                      USE_COUNT: tl.constexpr, TILE: tl.constexpr, L_BLOCK: tl.constexpr,
                      NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr,
                      HAS_REP: tl.constexpr, HAS_PF: tl.constexpr):
    """tau = max{t : W(t) >= target}, W(t) = #{x >= t} (top-k) or sum_{x >= t} exp(x - M) (top-p).

    Invariants: lo is a data value with W(lo) >= target; pv is the largest data value that may
    still be tau (every data value above pv has W < target). Each round evaluates NPIV pivots in
    (lo, pv] in one pass: half spaced evenly in value (fast on real logit distributions), half
    evenly in the fp32 key space (at least log2(NPIV/2 + 1) bits per round whatever the spread).
    Per pivot it reduces count, mass, the smallest data value >= t and the largest < t, which
    snap lo / pv onto data values. Ends when lo == pv: then tau = lo exactly, ties included.
    Returns (tau, W_mass(tau)).
    """
    H: tl.constexpr = NPIV // 2
    j = tl.arange(0, NPIV)
    jj = (j % H + 1).to(tl.int64)
    rounds = tl.zeros([], tl.int32)
    while (lo < pv) & (rounds < MAX_ROUNDS):
        klo = _key(lo).to(tl.int64)
        kpv = _key(pv).to(tl.int64)
        kp = klo + ((kpv - klo) * jj + H - 1) // H
        key_piv = _unkey(kp.to(tl.int32))
        f = jj.to(tl.float32) / (H + 1)
        val_piv = lo * (1.0 - f) + pv * f
        val_piv = tl.minimum(tl.maximum(val_piv, _unkey((klo + 1).to(tl.int32))), pv)
        piv = tl.where(j < H, val_piv, key_piv)

        cnt = tl.zeros([NPIV], dtype=tl.float32)
        mass = tl.zeros([NPIV], dtype=tl.float32)
        nxt = tl.full([NPIV], float("inf"), dtype=tl.float32)
        prv = tl.full([NPIV], float("-inf"), dtype=tl.float32)
        for start in range(0, V, TILE):
            offs, inb, xp, x = _load_tile(lrow_ptr, irow_ptr, L, plen, start, V, rep, pres, freq,
                                          tdiv, ovf_row, xp_max, TILE, L_BLOCK, HAS_REP,
                                          HAS_PF)
            ge = x[:, None] >= piv[None, :]
            if USE_COUNT:
                cnt += tl.sum(ge.to(tl.float32), axis=0)
            e = tl.exp(x - M)
            mass += tl.sum(tl.where(ge, e[:, None], 0.0), axis=0)
            nxt = tl.minimum(nxt, tl.min(tl.where(ge, x[:, None], float("inf")), axis=0))
            prv = tl.maximum(prv, tl.max(tl.where(ge, float("-inf"), x[:, None]), axis=0))
        if USE_COUNT:
            w = cnt
        else:
            w = mass
        ok = w >= target
        n_ok = tl.sum(ok.to(tl.int32), axis=0)
        # W is non-increasing in t (sums of a shrinking set, same order), so the ok pivots are
        # exactly the low ones: the largest ok pivot gives lo, the smallest failing one gives pv.
        lo = tl.where(n_ok > 0, tl.max(tl.where(ok, nxt, float("-inf")), axis=0), lo)
        lo_mass = tl.where(n_ok > 0, tl.min(tl.where(ok, mass, float("inf")), axis=0), lo_mass)
        pv = tl.where(n_ok < NPIV, tl.min(tl.where(ok, float("inf"), prv), axis=0), pv)
        rounds += 1
    return lo, lo_mass


@triton.jit(do_not_specialize=["plen_s", "topk_s", "seed_s", "off_s", "L"])
def _fused_sample_kernel(
    logits_ptr, stride_lb, V,
    ids_ptr, stride_ib, L, plen_ptr, plen_s,
    temp_ptr, temp_s, topk_ptr, topk_s, topp_ptr, topp_s, minp_ptr, minp_s,
    rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s,
    seed_ptr, seed_s, off_ptr, off_s,
    tok_ptr, logp_ptr, probs_ptr, stride_pb,
    TEMP_T: tl.constexpr, TOPK_T: tl.constexpr, TOPP_T: tl.constexpr, MINP_T: tl.constexpr,
    REP_T: tl.constexpr, PRES_T: tl.constexpr, FREQ_T: tl.constexpr, PLEN_T: tl.constexpr,
    SEED_T: tl.constexpr, OFF_T: tl.constexpr,
    HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, HAS_MINP: tl.constexpr,
    HAS_REP: tl.constexpr, HAS_PF: tl.constexpr, WRITE_PROBS: tl.constexpr,
    TILE: tl.constexpr, L_BLOCK: tl.constexpr, NPIV: tl.constexpr, MAX_ROUNDS: tl.constexpr,
):
    """Sample one token per row (or write the row's distribution when WRITE_PROBS).

    Math per row, transformers' order:
        xp = repetition(l) - (presence * [c > 0] + frequency * c)     c = count in output ids
        x  = xp / T                                                    T == 0: argmax(xp)
        keep i  iff  x_i >= tau_k,  tau_k = k-th largest x (ties with it kept)
               and  x_i >= tau_p,  tau_p = max{t : sum_{x >= t, x >= tau_k} e^(x-M) >= p * Z_k}
               and  e^(x_i - M) >= min_p
        token = argmax_{kept} (x_i - M + Gumbel_i),  Gumbel_i = -log(-log u(seed, offset, i))
        logprob = x_tok - M - log(sum_{kept} e^(x - M))

    Passes over the row (each reads V * dtype_bytes, plus L * 8 bytes of history ids per tile
    when penalties are on): 1 statistics pass (max, argmax, Z online, min, NaN/inf counts);
    top-k search rounds (typically 3-6, at most MAX_ROUNDS) when 0 < k < #finite; top-p
    search rounds likewise when p < 1; 1 draw pass (2 with WRITE_PROBS: Z, then the writes).
    Greedy and invalid rows stop after the statistics pass.
    """
    row = tl.program_id(0).to(tl.int64)
    lrow = logits_ptr + row * stride_lb
    irow = ids_ptr + row * stride_ib

    T = _param(temp_ptr, temp_s, row, TEMP_T)
    rep = _param(rep_ptr, rep_s, row, REP_T)
    pres = _param(pres_ptr, pres_s, row, PRES_T)
    freq = _param(freq_ptr, freq_s, row, FREQ_T)
    plen = _param(plen_ptr, plen_s, row, PLEN_T, tl.int64)
    greedy = T == 0.0
    inf = float("inf")
    bad = ~((T >= 0.0) & (T < inf)) | ~((rep > 0.0) & (rep < inf))
    bad = bad | ~(tl.abs(pres) < inf) | ~(tl.abs(freq) < inf)
    tdiv = tl.where(greedy | bad, 1.0, T)

    # ---- pass 1: statistics -------------------------------------------------------------------
    no_flag = row < 0
    M = tl.full([], float("-inf"), tl.float32)
    Z = tl.zeros([], tl.float32)
    lmin = tl.full([], float("inf"), tl.float32)
    nfin = tl.zeros([], tl.int32)
    nposinf = tl.zeros([], tl.int32)
    nnan = tl.zeros([], tl.int32)
    gbest = tl.full([], float("-inf"), tl.float32)
    ntie = tl.zeros([], tl.int32)
    gidx = row * 0 - 1
    for start in range(0, V, TILE):
        offs, inb, xp, x = _load_tile(lrow, irow, L, plen, start, V, rep, pres, freq, tdiv, no_flag,
                                      gbest, TILE, L_BLOCK, HAS_REP, HAS_PF)
        isnan = xp != xp
        nnan += tl.sum(isnan.to(tl.int32), axis=0)
        xg = tl.where(isnan, float("-inf"), xp)
        tmax = tl.max(xg, axis=0)
        targ = tl.argmax(xg, 0, tie_break_left=True)
        tcnt = tl.sum((xg == tmax).to(tl.int32), axis=0)
        ntie = tl.where(tmax > gbest, tcnt, tl.where(tmax == gbest, ntie + tcnt, ntie))
        gidx = tl.where(tmax > gbest, start + targ.to(tl.int64), gidx)
        gbest = tl.maximum(gbest, tmax)
        fin = (x > float("-inf")) & (x < float("inf"))
        nfin += tl.sum(fin.to(tl.int32), axis=0)
        nposinf += tl.sum((x == float("inf")).to(tl.int32), axis=0)
        new_m = tl.maximum(M, tl.max(tl.where(fin, x, float("-inf")), axis=0))
        scale = tl.where(M == new_m, 1.0, tl.exp(M - new_m))
        Z = Z * scale + tl.sum(tl.where(fin, tl.exp(x - new_m), 0.0), axis=0)
        M = new_m
        lmin = tl.minimum(lmin, tl.min(tl.where(fin, x, float("inf")), axis=0))

    # A row whose max x overflows is the limit T -> 0: uniform over the ntie tokens with
    # xp == gbest (tdiv is 1 on greedy / invalid rows, which the flag does not change).
    ovf_row = (nposinf > 0) | ((nfin == 0) & (gbest > float("-inf")))
    M = tl.where(ovf_row, 0.0, M)
    Z = tl.where(ovf_row, ntie.to(tl.float32), Z)
    lmin = tl.where(ovf_row, 0.0, lmin)
    nfin = tl.where(ovf_row, ntie, nfin)

    k = _param(topk_ptr, topk_s, row, TOPK_T, tl.int64)
    p = _param(topp_ptr, topp_s, row, TOPP_T)
    minp = _param(minp_ptr, minp_s, row, MINP_T)
    bad = bad | (k < 0) | (p < 0.0) | (p > 1.0) | (p != p)
    bad = bad | (minp < 0.0) | (minp > 1.0) | (minp != minp)
    valid = (nnan == 0) & (nfin > 0) & (~bad)
    sampling = valid & (~greedy)

    # ---- threshold searches ---------------------------------------------------------------------
    tau = lmin
    z_k = Z
    if HAS_TOPK:
        if sampling & (k > 0) & (k < nfin):
            tau, z_k = _threshold_search(lrow, irow, L, plen, V, rep, pres, freq, tdiv, ovf_row,
                                         gbest, M, lmin, M, Z, k.to(tl.float32), True, TILE,
                                         L_BLOCK, NPIV, MAX_ROUNDS, HAS_REP, HAS_PF)
    if HAS_TOPP:
        if sampling & (p < 1.0):
            tau, z_k = _threshold_search(lrow, irow, L, plen, V, rep, pres, freq, tdiv, ovf_row,
                                         gbest, M, tau, M, z_k, p * z_k, False, TILE, L_BLOCK,
                                         NPIV, MAX_ROUNDS, HAS_REP, HAS_PF)

    # ---- draw (or distribution) pass ----------------------------------------------------------
    z_f = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    bidx = row * 0 - 1
    bx = tl.zeros([], tl.float32)
    if sampling:
        seed = _param(seed_ptr, seed_s, row, SEED_T, tl.int64).to(tl.uint64)
        off = _param(off_ptr, off_s, row, OFF_T, tl.int64).to(tl.uint64)
        rkey = _splitmix64(seed ^ _splitmix64(off))
        k0 = (rkey & 0xFFFFFFFF).to(tl.uint32)
        k1 = (rkey >> 32).to(tl.uint32)
        for start in range(0, V, TILE):
            offs, inb, xp, x = _load_tile(lrow, irow, L, plen, start, V, rep, pres, freq, tdiv,
                                          ovf_row, gbest, TILE, L_BLOCK, HAS_REP, HAS_PF)
            e = tl.exp(x - M)
            keep = inb & (x >= tau)
            if HAS_MINP:
                keep = keep & (e >= minp)
            z_f += tl.sum(tl.where(keep, e, 0.0), axis=0)
            if not WRITE_PROBS:
                u = _uniform(k0, k1, offs)
                g = -tl.log(-tl.log(u))
                score = tl.where(keep, (x - M) + g, float("-inf"))
                tb = tl.max(score, axis=0)
                ti = tl.argmax(score, 0, tie_break_left=True)
                tx = tl.max(tl.where(tl.arange(0, TILE) == ti, x, float("-inf")), axis=0)
                upd = tb > best
                bidx = tl.where(upd, start + ti.to(tl.int64), bidx)
                bx = tl.where(upd, tx, bx)
                best = tl.maximum(best, tb)

    if WRITE_PROBS:
        prow = probs_ptr + row * stride_pb
        inv_z = 1.0 / z_f
        for start in range(0, V, TILE):
            offs = start + tl.arange(0, TILE).to(tl.int64)
            inb = offs < V
            if sampling:
                offs, inb, xp, x = _load_tile(lrow, irow, L, plen, start, V, rep, pres, freq,
                                              tdiv, ovf_row, gbest, TILE, L_BLOCK, HAS_REP,
                                              HAS_PF)
                e = tl.exp(x - M)
                keep = x >= tau
                if HAS_MINP:
                    keep = keep & (e >= minp)
                pr = tl.where(keep, e * inv_z, 0.0)
            else:
                pr = tl.where(valid & (offs == gidx), 1.0, 0.0)
            tl.store(prow + offs, pr, mask=inb)
    else:
        tok = tl.where(greedy, gidx, bidx)
        tok = tl.where(valid, tok, -1)
        lp = tl.where(greedy, 0.0, (bx - M) - tl.log(z_f))
        lp = tl.where(valid, lp, float("-inf"))
        tl.store(tok_ptr + row, tok)
        tl.store(logp_ptr + row, lp)


def _next_pow2(n):
    return 1 << max(0, int(n) - 1).bit_length()


def _alloc(shape, dtype, device):
    """Output allocation; tests swap it for poisoned buffers with guard bands."""
    return torch.empty(shape, dtype=dtype, device=device)


def _split(value, dummy):
    """(pointer tensor, scalar, is_tensor) for a number-or-(B,) parameter."""
    if isinstance(value, torch.Tensor):
        return value.contiguous(), 0, True
    return dummy, value, False


def fused_sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                 input_ids=None, prompt_lens=None, seed=0, offset=0, write_probs=False,
                 tile=None, npiv=16, max_rounds=64, num_warps=None):
    """Launch ``_fused_sample_kernel`` over the rows of ``logits`` [B, V].

    Parameters are already validated by the public layer (gpu_sampler.sample): each is a Python
    number for every row or a contiguous (B,) tensor on the logits' device (float32 for float
    parameters, int64 for top_k / prompt_lens / seed / offset). Returns (tokens int64 [B],
    logprobs float32 [B]) or, with ``write_probs``, the float32 [B, V] distribution.
    """
    B, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if tile is None:
        tile = min(_next_pow2(V), 2048 if interp else 1024)
    tile = max(16, tile)

    def on(v):
        return isinstance(v, torch.Tensor)

    has_hist = input_ids is not None and input_ids.shape[1] > 0
    has_rep = has_hist and (on(repetition_penalty) or repetition_penalty != 1.0)
    has_pf = has_hist and (on(presence_penalty) or on(frequency_penalty)
                           or presence_penalty != 0.0 or frequency_penalty != 0.0)
    has_topk = on(top_k) or 0 < top_k < V
    has_topp = on(top_p) or top_p < 1.0
    has_minp = on(min_p) or min_p > 0.0
    if has_rep or has_pf:
        ids = input_ids if input_ids.stride(1) == 1 else input_ids.contiguous()
        L, stride_ib = ids.shape[1], ids.stride(0)
    else:
        ids, L, stride_ib = logits, 0, 0
    l_block = min(max(16, _next_pow2(L)), 1024)

    if write_probs:
        probs = _alloc((B, V), torch.float32, dev)
        tok = logp = probs  # not written in this mode
    else:
        tok = _alloc((B,), torch.int64, dev)
        logp = _alloc((B,), torch.float32, dev)
        probs = tok

    dummy = logits
    args = []
    flags = []
    for v in (prompt_lens if prompt_lens is not None else 0, temperature, top_k, top_p, min_p,
              repetition_penalty, presence_penalty, frequency_penalty, seed, offset):
        ptr, s, is_t = _split(v, dummy)
        args += [ptr, s]
        flags.append(is_t)
    (plen_p, plen_s, temp_p, temp_s, topk_p, topk_s, topp_p, topp_s, minp_p, minp_s,
     rep_p, rep_s, pres_p, pres_s, freq_p, freq_s, seed_p, seed_s, off_p, off_s) = args
    if num_warps is None:
        num_warps = 8 if tile >= 1024 else 4
    _fused_sample_kernel[(B,)](
        logits, logits.stride(0), V,
        ids, stride_ib, L, plen_p, int(plen_s),
        temp_p, float(temp_s), topk_p, int(topk_s), topp_p, float(topp_s), minp_p, float(minp_s),
        rep_p, float(rep_s), pres_p, float(pres_s), freq_p, float(freq_s),
        seed_p, int(seed_s), off_p, int(off_s),
        tok, logp, probs, probs.stride(0) if write_probs else 0,
        TEMP_T=flags[1], TOPK_T=flags[2], TOPP_T=flags[3], MINP_T=flags[4],
        REP_T=flags[5], PRES_T=flags[6], FREQ_T=flags[7], PLEN_T=flags[0],
        SEED_T=flags[8], OFF_T=flags[9],
        HAS_TOPK=has_topk, HAS_TOPP=has_topp, HAS_MINP=has_minp,
        HAS_REP=has_rep, HAS_PF=has_pf, WRITE_PROBS=write_probs,
        TILE=tile, L_BLOCK=l_block, NPIV=npiv, MAX_ROUNDS=max_rounds,
        num_warps=num_warps,
    )
    if write_probs:
        return probs
    return tok, logp
