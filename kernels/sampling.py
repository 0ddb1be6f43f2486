"""Launcher of the sampling kernels: penalties, temperature, top-k, top-p, min-p and the draw.

A call is two launches over the [B, V] logits (three with penalties, two more when a row can
have min-p and no top-k / top-p, one more for the distribution), with a static workspace per
(B, V, L):

    kernels/history.py  _bucket_history_kernel  grid (B,)     history ids -> edits bucketed by block
    kernels/stats.py    _stats_kernel           grid (B, C)   the one read: block partials + candidates
    kernels/merge.py    _merge_kernel           grid (B,)     merge, thresholds, min-p, draw, logprob
                                                              (+ exact fallback over the row for
                                                              rows with a threshold to search)
    kernels/second.py   _gather_kernel          grid (B, C)   the second read of rows handed over
                                                              (min-p alone, unproven pure T)
    kernels/second.py   _finish_kernel          grid (B,)     their token, logprob (or Z_f)
    kernels/merge.py    _write_probs_kernel     grid (B, C)   sampling_distribution only

C (chunks per row) only changes which program handles which block: every partial is per block
and merged in block order, so tokens and logprobs are bit-identical for any C and any batch.
See kernels/README.md for the bounds, the pass counts and the bytes.
"""
import functools
import os

import torch
import triton

from .history import _bucket_history_kernel
from .launch import log_alpha, next_pow2, split_param
from .merge import NS, S_TAU, S_ZF, _merge_kernel, _write_probs_kernel
from .second import NQ, NQI, NR, _finish_kernel, _gather_kernel
from .stats import NF, NI, _stats_kernel

INVALID_TOKEN = -1
SMS = 132                  # H100 / H200 SMs: the launch geometry below is planned for them
STATS_REGS = 64            # stage 1 is compiled to <= 64 registers (no spills): 8 programs per SM
STATS_SLOTS = 8 * SMS      # stage-1 programs resident at once (4 warps, <= 64 regs)
# With repetition *and* presence/frequency penalties, the pure-temperature draw loop of stage 1
# needs 72 registers (64 spilled 40 bytes, kernels/README.md): 7 programs per SM there.
STATS_REGS_PF = 72
STATS_SLOTS_PF = 7 * SMS
MERGE_REGS = 128           # the merge (8 warps) fits two programs per SM: 264 rows a wave
MIN_CAPACITY = 4096        # candidate slots per row at least (spread as KT per block)


def _alloc(shape, dtype, device):
    """Output allocation; tests swap it for poisoned buffers with guard bands."""
    return torch.empty(shape, dtype=dtype, device=device)


def _regs(n):
    """A register cap as a launch option: an NVIDIA compile option, which the interpreter
    ignores and ROCm's compiler does not take."""
    return {} if torch.version.hip else {"maxnreg": n}


def _workspace(shape, dtype, device):
    """Scratch allocation (never returned); tests swap it for poisoned buffers."""
    return torch.empty(shape, dtype=dtype, device=device)


def _cdiv(a, b):
    # Plain integer division: triton.cdiv is a jit-wrapped function whose host-side call costs
    # microseconds, and the first GPU run showed ~70 of them per sample() call dominating it.
    return -(-a // b)


def _chunks(B, nt, slots=STATS_SLOTS):
    """Stage-1 programs per row: the least work on the busiest slot, ceil(B C / S) waves of
    ceil(NT / C) blocks plus a program's fixed cost (~1/8 block), then the fewest programs."""
    return min(range(1, nt + 1),
               key=lambda c: (_cdiv(B * c, slots) * (8 * _cdiv(nt, c) + 1), c))


def plan(B, V, *, tile=None, chunks=None, cand=None, slots=STATS_SLOTS):
    """Static launch geometry for a (B, V) call: dict(TILE, NT, NT_P2, KT, CB, C, TPC)."""
    return dict(_plan(B, V, tile, chunks, cand, slots))


@functools.lru_cache(maxsize=256)
def _plan(B, V, tile, chunks, cand, slots):
    # Cached: a decode loop asks for the same (B, V) every step, and the host time of a call
    # is what a small batch pays (the kernels at B = 1 are tens of microseconds).
    tile = max(16, min(1024, next_pow2(V) if tile is None else int(tile)))  # counts fit 11 bits
    nt = _cdiv(V, tile)
    kt = cand if cand is not None else min(tile, max(64, next_pow2(_cdiv(MIN_CAPACITY, nt))))
    c = chunks if chunks is not None else _chunks(max(B, 1), nt, slots)
    c = max(1, min(int(c), nt))
    tpc = _cdiv(nt, c)
    c = _cdiv(nt, tpc)
    cb = max(kt, min(1024, next_pow2(nt * kt)))
    return tuple(dict(TILE=tile, NT=nt, NT_P2=max(2, next_pow2(nt)), KT=kt, CB=cb, C=c,
                      TPC=tpc).items())


def fused_sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                 input_ids=None, prompt_lens=None, seed=0, offset=0, write_probs=False,
                 amateur_logits=None, cd_alpha=0.1, cd_beta=0.5,
                 tile=None, npiv=8, max_rounds=64, num_warps=None, chunks=None, cand=None):
    """Sample one token per row of ``logits`` [B, V] (or write the distribution).

    Parameters are already validated by the public layer (gpu_sampler.sample): each is a Python
    number for every row or a contiguous (B,) tensor on the logits' device (float32 for float
    parameters, int64 for top_k / prompt_lens / seed / offset). Returns (tokens int64 [B],
    logprobs float32 [B]) or, with ``write_probs``, the float32 [B, V] distribution.
    With ``amateur_logits`` [B, V] (contrastive decoding; cd_alpha / cd_beta validated the same
    way) the rows are the contrastive scores of gpu_sampler/contrastive.py, computed inside the
    same launches: one extra read of the amateur logits, no [B, V] scores in memory.
    ``tile`` (statistics block), ``chunks`` (programs per row in stage 1) and ``cand``
    (candidate slots per block) change the geometry, never the result (tests force them).
    """
    B, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device

    def on(v):
        return isinstance(v, torch.Tensor)

    has_hist = input_ids is not None and input_ids.shape[1] > 0
    has_rep = has_hist and (on(repetition_penalty) or repetition_penalty != 1.0)
    has_pf = has_hist and (on(presence_penalty) or on(frequency_penalty)
                           or presence_penalty != 0.0 or frequency_penalty != 0.0)
    cd = amateur_logits is not None
    # Can a row be pure temperature (kernels/common.py _pure_row)? Decided from the Python
    # scalars alone (a tensor parameter may hold anything): a scalar top-k in (0, V), top-p < 1,
    # min-p > 0 or T == 0 rules it out for every row, and then stage 1 and the merge compile
    # without the pure path (the tuned case's code is v2's).
    pure_possible = ((on(top_k) or not 0 < top_k < V) and (on(top_p) or top_p >= 1.0)
                     and (on(min_p) or min_p <= 0.0) and (on(temperature) or temperature > 0))
    pure_ok = pure_possible and not write_probs and not cd  # stage 1 writes draw partials
    # Can a row need the second read (kernels/second.py: min-p and no top-k / top-p, T > 0)?
    # Then the merge hands such rows over and two more launches, both over the whole grid,
    # finish them. A launch with no min-p anywhere does not pay for them: its only such rows are
    # pure rows whose winner the merge could not prove (logits ~1e6, kernels/README.md), which
    # keep the merge's row pass.
    second = ((on(top_k) or not 0 < top_k < V) and (on(top_p) or top_p >= 1.0)
              and (on(temperature) or temperature > 0) and (on(min_p) or min_p > 0.0))
    wide = pure_ok and has_rep and has_pf  # that variant needs 72 registers (no spills)
    g = plan(B, V, tile=tile, chunks=chunks, cand=cand,
             slots=STATS_SLOTS_PF if wide else STATS_SLOTS)
    TILE, NT = g["TILE"], g["NT"]
    has_topk = on(top_k) or 0 < top_k < V
    has_topp = on(top_p) or top_p < 1.0
    has_minp = on(min_p) or min_p > 0.0

    dummy = logits
    if cd:
        am = amateur_logits if amateur_logits.stride(1) == 1 else amateur_logits.contiguous()
        la_p, la_s, la_t = split_param(log_alpha(cd_alpha), dummy)
        beta_p, beta_s, beta_t = split_param(cd_beta, dummy)
        wc = _workspace((B, 2, NT), torch.float32, dev)
    else:
        am, la_p, la_s, la_t, beta_p, beta_s, beta_t, wc = dummy, dummy, 0.0, False, dummy, 0.0, \
            False, dummy
    cdargs = (am, am.stride(0), la_p, float(la_s), beta_p, float(beta_s))
    cdflags = dict(LA_T=la_t, BETA_T=beta_t, CD=cd)
    # no FMA with CD: the twin rounds (1 + beta) * e and beta * a separately
    extra = {"enable_fp_fusion": False} if cd and os.environ.get("TRITON_INTERPRET") != "1" else {}
    args, flags = [], []
    for v in (prompt_lens if prompt_lens is not None else 0, temperature, top_k, top_p, min_p,
              repetition_penalty, presence_penalty, frequency_penalty, seed, offset):
        ptr, s, is_t = split_param(v, dummy)
        args += [ptr, s]
        flags.append(is_t)
    (plen_p, plen_s, temp_p, temp_s, topk_p, topk_s, topp_p, topp_s, minp_p, minp_s,
     rep_p, rep_s, pres_p, pres_s, freq_p, freq_s, seed_p, seed_s, off_p, off_s) = args
    temp_s, topp_s, minp_s = float(temp_s), float(topp_s), float(minp_s)
    rep_s, pres_s, freq_s = float(rep_s), float(pres_s), float(freq_s)

    e_block = 32
    if has_rep or has_pf:
        ids = input_ids if input_ids.stride(1) == 1 else input_ids.contiguous()
        L = ids.shape[1]
        e_block = max(32, min(256, next_pow2(_cdiv(L, NT))))  # ~ one block's edits
        edits = _workspace((B, L), torch.int32, dev)
        bnd = _workspace((B, 2, NT), torch.int32, dev)
        _bucket_history_kernel[(B,)](
            ids, ids.stride(0), L, plen_p, int(plen_s), edits, bnd, NT,
            PLEN_T=flags[0], TILE=TILE, L_BLOCK=256 if L <= 2048 else 1024,
            NT_P2=g["NT_P2"], num_warps=8)
        stride_eb = L
    else:
        edits = bnd = dummy
        stride_eb = 0

    wf = _workspace((B, NF.value, NT), torch.float32, dev)
    wi = _workspace((B, NI.value, NT), torch.int32, dev)
    cand = _workspace((B, NT, g["KT"]), torch.int64, dev)
    xs = _workspace((B, NT * g["KT"]), torch.float32, dev)
    xi = _workspace((B, NT * g["KT"]), torch.int32, dev)
    if num_warps is None:
        num_warps = 4  # stage 1: small programs, 8 resident per SM at <= 64 registers
    common = dict(TEMP_T=flags[1], REP_T=flags[5], PRES_T=flags[6], FREQ_T=flags[7],
                  HAS_REP=has_rep, HAS_PF=has_pf, TILE=TILE, E_BLOCK=e_block)
    # stride_lb / stride_ab are not specialised (kernels/stats.py: one element per thread)
    _stats_kernel[(B, g["C"])](
        logits, logits.stride(0), V, NT, g["TPC"], edits, stride_eb, bnd,
        temp_p, temp_s, rep_p, rep_s, pres_p, pres_s, freq_p, freq_s,
        topk_p, int(topk_s), topp_p, topp_s, minp_p, minp_s, seed_p, int(seed_s), off_p,
        int(off_s), wf, wi, cand, *cdargs, wc, KT=g["KT"], NWIN=8, D0_EXP=-2,
        num_warps=num_warps, R=min(TILE, 32 * num_warps),
        **_regs(STATS_REGS_PF if wide else STATS_REGS),
        TOPK_T=flags[2], TOPP_T=flags[3], MINP_T=flags[4], SEED_T=flags[8], OFF_T=flags[9],
        HAS_TOPK=has_topk, HAS_TOPP=has_topp, HAS_MINP=has_minp,
        PURE_OK=pure_ok, **cdflags, **common, **extra)

    if write_probs:
        sf = _workspace((B, NS.value), torch.float32, dev)
        si = _workspace((B, 2), torch.int32, dev)
        tok = logp = sf  # not written in this mode
    else:
        tok = _alloc((B,), torch.int64, dev)
        logp = _alloc((B,), torch.float32, dev)
        sf = si = tok
    rf = _workspace((B, NR.value), torch.float32, dev) if second else dummy
    merge_warps = 8 if TILE >= 1024 else 4
    _merge_kernel[(B,)](
        logits, logits.stride(0), V, NT, edits, stride_eb, bnd,
        temp_p, temp_s, topk_p, int(topk_s), topp_p, topp_s, minp_p, minp_s,
        rep_p, rep_s, pres_p, pres_s, freq_p, freq_s,
        seed_p, int(seed_s), off_p, int(off_s),
        wf, wi, cand, xs, xi, tok, logp, sf, si, rf, *cdargs, wc,
        TOPK_T=flags[2], TOPP_T=flags[3], MINP_T=flags[4], SEED_T=flags[8], OFF_T=flags[9],
        HAS_TOPK=has_topk, HAS_TOPP=has_topp, HAS_MINP=has_minp, WRITE_PROBS=write_probs,
        PURE_OK=pure_ok, SECOND=second,
        KT=g["KT"], CB=g["CB"], NT_P2=g["NT_P2"], NPIV=npiv, MAX_ROUNDS=max_rounds,
        NB=256, INV_W=16.0, LB_BLOCK=256, DIRTY_MAX=8, NWIN=8, D0_EXP=-2,
        num_warps=merge_warps, R=min(TILE, 32 * merge_warps), **_regs(MERGE_REGS), **cdflags,
        **common, **extra)
    if second:
        qf = _workspace((B, NQ.value, NT), torch.float32, dev)
        qi = _workspace((B, NQI.value, NT), torch.int32, dev)
        _gather_kernel[(B, g["C"])](
            logits, logits.stride(0), V, NT, g["TPC"], edits, stride_eb, bnd,
            temp_p, temp_s, rep_p, rep_s, pres_p, pres_s, freq_p, freq_s, minp_p, minp_s,
            seed_p, int(seed_s), off_p, int(off_s), rf, tok, sf, qf, qi, *cdargs,
            MINP_T=flags[4], SEED_T=flags[8], OFF_T=flags[9], HAS_MINP=has_minp,
            WRITE_PROBS=write_probs, S_ZF=S_ZF, NS=NS, num_warps=num_warps, **cdflags, **common,
            **extra)
        _finish_kernel[(B,)](
            NT, rf, qf, qi, tok, logp, sf, S_TAU=S_TAU, S_ZF=S_ZF, NS=NS,
            WRITE_PROBS=write_probs, NT_P2=g["NT_P2"], num_warps=4)
    if not write_probs:
        return tok, logp
    probs = _alloc((B, V), torch.float32, dev)
    _write_probs_kernel[(B, g["C"])](
        logits, logits.stride(0), V, NT, g["TPC"], edits, stride_eb, bnd,
        temp_p, temp_s, minp_p, minp_s, rep_p, rep_s, pres_p, pres_s, freq_p, freq_s,
        sf, si, probs, probs.stride(0), *cdargs, MINP_T=flags[4], HAS_MINP=has_minp,
        num_warps=num_warps, **cdflags, **common, **extra)
    return probs
