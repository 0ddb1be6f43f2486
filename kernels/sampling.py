"""Launcher of the sampling kernels: penalties, temperature, top-k, top-p, min-p and the draw.

A call is two launches over the [B, V] logits (three with penalties, except a repetition
penalty over a short history at a small batch: _direct_history; two more when a row can have
min-p and no top-k / top-p, two more when a row can have top-p without top-k (the merge plans
its band), one fewer when both (one finish for both), one fewer again when the batch is small
(one gather for both: _Call.fuse); one more for the distribution), with a static
workspace per (B, V, L):

    kernels/history.py  _bucket_history_kernel  grid (B,)     history ids -> edits bucketed by block
    kernels/stats.py    _stats_kernel           grid (B, C)   the one read: block partials + candidates
    kernels/merge.py    _merge_kernel           grid (B,)     merge, thresholds, min-p, draw, logprob
                                                              (+ exact fallback over the row for
                                                              rows with a threshold to search)
    kernels/second.py   _gather_kernel          grid (B, C)   the second read of rows handed over
                                                              (min-p alone, unproven pure T); a
                                                              row's last program finishes it
    kernels/second.py   _finish_kernel          grid (B,)     their token, logprob (or Z_f) where
                                                              the gather cannot (pres./freq.)
    kernels/band.py     _band_gather_kernel     grid (B, C)   the second read of top-p rows (no
                                                              top-k) the merge hands over with their
                                                              band plan: above / band / below
    kernels/band.py     _band_finish_kernel     grid (B, FP)  tau's bucket, the list in FP slices;
                                                              the last program: tau, draw (or the
                                                              merge's row pass if the band failed)
    kernels/merge.py    _write_probs_kernel     grid (B, C)   sampling_distribution only
    kernels/residual.py _residual_kernel        grid (B, C')  speculative verification against
                                                or (B,)       draft distributions: p(d) and the
                        _residual_finish        grid (B,)     residual draw, instead of the
                                                              distribution (the finish only
                                                              with the (B, C') grid)

C (chunks per row) only changes which program handles which block: every partial is per block
and merged in block order, so tokens and logprobs are bit-identical for any C and any batch.
See kernels/README.md for the bounds, the pass counts and the bytes.
"""
import dataclasses
import functools
from typing import NamedTuple

import torch
import triton

from .common import NBIN
from .history import _bucket_history_kernel
from .launch import edit_table, exact_fp, log_cut, next_pow2, split_param
from .band import NG, NSP, NSPI, _band_finish_kernel, _band_gather_kernel
from .band_plan import NBF, NBI, NBUCK
from .merge import NS, S_TAU, S_ZF, _merge_kernel, _write_probs_kernel
from .residual import NP, NPI, _residual_finish, _residual_kernel
from .second import NQ, NQI, NR, SHARE_LIST, _finish_kernel, _gather_kernel
from .stats import NF, NI, _stats_kernel
from .topn import NRAW, _top_n_kernel

INVALID_TOKEN = -1
SMS = 132                  # H100 / H200 SMs: the launch geometry below is planned for them
STATS_REGS = 64            # stage 1 is compiled to <= 64 registers: 8 programs per SM (a few
# variants spill 4-16 bytes of row-uniform values there, reloaded once a block: aot.SPILL_BOUND)
STATS_SLOTS = 8 * SMS      # stage-1 programs resident at once (4 warps, <= 64 regs)
# With repetition *and* presence/frequency penalties, the pure-temperature draw loop of stage 1
# needs 72 registers (64 spilled 40 bytes, kernels/README.md): 7 programs per SM there.
STATS_REGS_PF = 72
STATS_SLOTS_PF = 7 * SMS
# With top-N logprobs every block also selects its best keys (tl.topk over 1024 int64 lanes):
# 122 registers without spills (64 spilled 336 bytes, 96 spilled 24): 4 programs per SM.
STATS_REGS_TOPN = 128
STATS_SLOTS_TOPN = 4 * SMS
# The band gather with the second read's gather in the same launch: 80 registers (72 spilled
# 8-20 bytes once its row came from second._row_share, not the program id), 6 programs per SM;
# with presence / frequency penalties 96 (80 spilled 4 bytes; 88 spilled 16 once the band
# gather's table pass followed its blocks), 5 per SM as at 88 (65536 / (128 x 96) = 5.3).
GATHER_REGS_WIDE = 80
GATHER_SLOTS_WIDE = 6 * SMS
# The gathers screen their draw (kernels/band.py _screened_winner, kernels/second.py
# _gather_block; the merge stores the second read's bound only then) above this many programs
# (B C): more than one a SM shares the SMs' issue slots, where skipping ~86% of the blocks'
# logs pays; at one block a program (B = 1) the slowest program is the launch, and a block
# that scores takes longer with the screen's test than without (modelled 6.2 against 5.5 us)
SCREEN_PROGRAMS = SMS
GATHER_REGS_PF = 96
BAND_SLICES = 16           # the band finish's slices of a row's band list, at most
GATHER_SLOTS_PF = 5 * SMS
RESIDUAL_SLOTS = 3 * SMS   # kernels/residual.py's read: 8 warps, 72-80 registers
# its cap: uncapped, the exact quotient took residual:solo to 97 registers (2 programs per SM)
RESIDUAL_REGS = 80
RAW_SLOTS = 64             # raw top-N candidates a block (the sampling candidates' windows)
MERGE_REGS = 128           # the merge (8 warps) fits two programs per SM: 264 rows a wave
# At most one merge row per SM runs one program per SM whatever the cap, so there the merge
# takes more: with the exact quotient (common._quotient) seven variants spill 4-28 bytes at 128
# (kernels/aot.py MERGE_SPILL_BOUND) and none at 168 (aot compiles both caps).
MERGE_REGS_ONE = 168
# The second read's finish (4 warps, one program per row): uncapped, ptxas chose 64 registers
# and spilled 8 bytes around the exact quotient; 71 at this cap, none spilled.
FINISH_REGS = 96
# With the row state of processed top-N logprobs the merge spills 16-20 bytes under 128 (and
# 136) registers, none at 168-178: one program per SM, the same as B <= 132 rows run anyway.
MERGE_REGS_STATE = 192
# So does the merge of a call without the history launch (_direct_history: 16 bytes at 128),
# which has at most SMS rows (B <= 8 at V = 128256): its programs never share an SM.
MIN_CAPACITY = 4096        # candidate slots per row at least (spread as KT per block)
HDIRECT_MAX = 256          # the longest history a stage-1 block histograms itself (_direct_history)


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


class _Param(NamedTuple):
    """A number-or-(B,) parameter as the kernels take it: a pointer read only when IS_TENSOR
    (``t``), else the scalar ``s``."""
    ptr: torch.Tensor
    s: object
    t: bool

    def pair(self):
        return self.ptr, self.s


# The parameters in the order of their IS_TENSOR flags, each with its scalar type. "minp" is
# min-p's cut in log space, ln(min_p) (params.log_cut; -inf = off): every kernel keeps
# x - M >= it, as the twin does.
_PARAMS = (("plen", int), ("temp", float), ("topk", int), ("topp", float), ("minp", float),
           ("rep", float), ("pres", float), ("freq", float), ("seed", int), ("off", int))


@dataclasses.dataclass(frozen=True)
class _Call:
    """What the launches of one fused_sample call share."""
    logits: torch.Tensor
    g: dict                 # plan(): TILE, NT, NT_P2, KT, CB, C, TPC
    p: dict                 # name -> _Param (see _PARAMS)
    hist: tuple             # (edits, stride_eb, bnd, table, stride_xb): the bucketed
                            # history and the mask / bias table, or dummies
    cdargs: tuple           # contrastive arguments (dummies without amateur logits)
    wc: torch.Tensor        # contrastive per-block workspace
    const: dict             # constexprs and compile options every sampling launch takes
    modes: dict             # HAS_TOPK / HAS_TOPP / HAS_MINP
    pure_ok: bool           # a row can be pure temperature: stage 1 writes draw partials
    second: bool            # a row can take the second read (kernels/second.py)
    bands: bool             # a row can take the band read (kernels/band.py)
    wide: bool              # the 72-register stage-1 variant
    num_warps: int
    top: "_Top"             # top-N logprobs (kernels/topn.py), kb = 0 when off
    regs: int               # stage 1's register cap (_stage1_budget)
    fuse: bool = False      # one gather launch for the second read and the band read: a call
                            # with both whose gather fits one wave at its register cap
                            # (B <= 6 at V = 128256, 5 with presence / frequency penalties;
                            # from the planned batch)
    fp: int = 16            # band finish programs per row (_band_programs, the planned batch)
    screen: bool = False    # the gathers screen their draw (more programs than
                            # SCREEN_PROGRAMS, the planned batch's)
    greedy: bool = False    # every row greedy (a scalar T = 0), nothing but tokens and their
                            # logprobs asked: stage 1 writes each block's max and first token
    greedy_rows: bool = False  # so do the greedy rows (T == 0) of a tensor T

    def flags(self, *names):
        """The IS_TENSOR constexprs of ``names`` (e.g. "topk" -> TOPK_T)."""
        return {f"{n.upper()}_T": self.p[n].t for n in names}


class _Top(NamedTuple):
    """Top-N logprobs in a call: N, slots per block (0 = off), raw or processed, and the
    workspaces (the blocks' keys and raw partials; the merge's row state, processed)."""
    n: int
    kb: int
    raw: bool
    reuse: bool             # raw logits = xp: the sampling candidates are the raw candidates
    topw: torch.Tensor
    rs: torch.Tensor
    sf: torch.Tensor
    si: torch.Tensor

    @property
    def state(self):
        return self.kb > 0 and not self.raw


def _top(logits, g, n, raw, reuse):
    """The call's _Top: the keys per block and their workspace, or off (dummies)."""
    if not n:
        return _Top(0, 0, True, False, logits, logits, logits, logits)
    B, NT, dev = logits.shape[0], g["NT"], logits.device
    # raw: up to RAW_SLOTS windowed candidates a block (the sampling candidates' KT with
    # ``reuse``); processed: its next_pow2(N) best keys
    kb = g["KT"] if reuse else min(RAW_SLOTS if raw else next_pow2(n), g["TILE"])
    topw = logits if reuse else _workspace((B, NT, kb), torch.int64, dev)
    rs = _workspace((B, NRAW.value, NT), torch.float32, dev) if raw else logits
    sf, si = ((logits, logits) if raw else (_workspace((B, NS.value), torch.float32, dev),
                                            _workspace((B, 2), torch.int32, dev)))
    return _Top(n, kb, raw, reuse, topw, rs, sf, si)


def _launch_top_n(c, cand):
    """The row's N best from the blocks' keys (kernels/topn.py), grid (B,): (ids, logprobs)."""
    g, L, top = c.g, c.logits, c.top
    B, dev = L.shape[0], L.device
    nsel = min(next_pow2(top.n), g["NT_P2"] * top.kb, g["TILE"])
    make = _alloc if top.n <= nsel else (lambda shape, dtype, d: torch.full(
        shape, -1 if dtype == torch.int64 else float("-inf"), dtype=dtype, device=d))
    ids, lp = make((B, top.n), torch.int64, dev), make((B, top.n), torch.float32, dev)
    _top_n_kernel[(B,)](
        L, L.stride(0), L.shape[1], cand if top.reuse else top.topw, top.rs, top.sf, top.si,
        *c.p["temp"].pair(),
        *c.p["minp"].pair(), ids, lp, g["NT"], top.n, **c.flags("temp", "minp"),
        HAS_MINP=c.modes["HAS_MINP"], RAW=top.raw, KB=top.kb, NSEL=nsel,
        GB=max(1, min(g["NT_P2"], 2048 // top.kb)), CB=max(nsel, min(512, top.kb * g["NT_P2"])),
        NT_P2=g["NT_P2"], TILE=g["TILE"], num_warps=8, **exact_fp())
    if top.raw and top.n > nsel:
        # places past the kernel's NSEL: (-1, -inf), and NaN for a row holding NaN or +inf
        # (its first place is NaN), as the twin gives; a device-side select, no host read
        lp[:, nsel:] = torch.where(lp[:, :1].isnan(), float("nan"), float("-inf"))
    return ids, lp


def _modes(logits, temperature, top_k, top_p, min_p, input_ids, rep, pres, freq, write_probs,
           cd, state=False):
    """Which code paths this call can need, from the Python scalars alone (a tensor
    parameter may hold anything): (has_rep, has_pf, pure_ok, second, bands, wide, modes)."""
    V = logits.shape[1]
    on = lambda v: isinstance(v, torch.Tensor)  # noqa: E731
    has_hist = input_ids is not None and input_ids.shape[1] > 0
    has_rep = has_hist and (on(rep) or rep != 1.0)
    has_pf = has_hist and (on(pres) or on(freq) or pres != 0.0 or freq != 0.0)
    no_k, no_p = (on(top_k) or not 0 < top_k < V), (on(top_p) or top_p >= 1.0)
    hot = on(temperature) or temperature > 0
    # Can a row be pure temperature (kernels/common.py _pure_row)? A scalar top-k in (0, V),
    # top-p < 1, min-p > 0 or T == 0 rules it out for every row, and then stage 1 and the
    # merge compile without the pure path (the tuned case's code is v2's).
    pure_ok = no_k and no_p and (on(min_p) or min_p <= 0.0) and hot \
        and not write_probs and not cd  # stage 1 writes draw partials
    # Can a row need the second read (min-p and no top-k / top-p, T > 0)? Then the merge hands
    # such rows over and two more launches, both over the whole grid, finish them. A launch
    # with no min-p anywhere does not pay for them: its only such rows are pure rows whose
    # winner the merge could not prove (logits ~1e6, kernels/README.md), which keep the
    # merge's row pass.
    second = no_k and no_p and hot and (on(min_p) or min_p > 0.0)
    # Can a row be top-p without top-k (T > 0)? Then stage 1 writes the band estimate and the
    # merge hands rows whose nucleus outgrew the candidates to the band read (three more
    # launches, kernels/band.py). Not for the distribution or contrastive decoding (the row
    # pass), nor a scalar top-k in (0, V) (the tuned case compiles without it), nor with the
    # row state of processed top-N logprobs (``state``: the band finish leaves none; such rows
    # take the row pass).
    bands = no_k and (on(top_p) or top_p < 1.0) and hot and not write_probs and not cd \
        and not state
    wide = pure_ok and has_rep and has_pf  # that variant needs 72 registers (no spills)
    modes = dict(HAS_TOPK=on(top_k) or 0 < top_k < V, HAS_TOPP=on(top_p) or top_p < 1.0,
                 HAS_MINP=on(min_p) or min_p > 0.0)
    return has_rep, has_pf, pure_ok, second, bands, wide, modes


def _contrastive(logits, amateur_logits, cd_alpha, cd_beta, NT):
    """(cdargs, wc, constexprs) for contrastive scores inside the launches, or dummies."""
    B, dev = logits.shape[0], logits.device
    cd = amateur_logits is not None
    if cd:
        am = amateur_logits if amateur_logits.stride(1) == 1 else amateur_logits.contiguous()
        la_p, la_s, la_t = split_param(log_cut(cd_alpha), logits)
        beta_p, beta_s, beta_t = split_param(cd_beta, logits)
        wc = _workspace((B, 2, NT), torch.float32, dev)
    else:
        am, la_p, la_s, la_t, beta_p, beta_s, beta_t, wc = logits, logits, 0.0, False, logits, \
            0.0, False, logits
    cdargs = (am, am.stride(0), la_p, float(la_s), beta_p, float(beta_s))
    return cdargs, wc, dict(LA_T=la_t, BETA_T=beta_t, CD=cd)


def _params(values, dummy):
    """name -> _Param for the number-or-(B,) parameters, scalars in their kernel type."""
    out = {}
    for (name, kind), v in zip(_PARAMS, values):
        ptr, s, t = split_param(v, dummy)
        out[name] = _Param(ptr, kind(s), t)
    return out


def _direct_history(input_ids, g, has_rep, has_pf, other):
    """Can the call skip the history launch (HDIRECT)? Where stage 1 runs one block a program
    (TPC 1, at most SMS rows: B <= 8 at V = 128256, one wave of latency-bound programs), a block
    histograms the row's ids itself for less than the launch costs (3 us eager); repetition
    penalty only (presence / frequency need the prompt / output split), L <= HDIRECT_MAX,
    contiguous ids (the row stride is L), and only stats + merge launches (no second read, band
    read, distribution, residual or contrastive scores: their kernels take the bucketed list).
    Decided from shapes and Python scalars: the result is the same either way."""
    if not has_rep or has_pf or other:
        return False
    L = input_ids.shape[1]
    return (g["TPC"] == 1 and input_ids.shape[0] <= SMS and L <= HDIRECT_MAX
            and input_ids.stride(1) == 1 and (input_ids.stride(0) == L or input_ids.shape[0] == 1))


def _history(logits, input_ids, p, g, needed, direct=False):
    """(edits, stride_eb, bnd, E_BLOCK): the history bucketed by vocabulary block (one small
    launch), the row's own ids with ``direct`` (stride_eb = L, no launch), or dummies when no
    penalty reads it."""
    if not needed:
        return logits, 0, logits, 32
    if direct:
        L = input_ids.shape[1]
        return input_ids, L, logits, max(32, next_pow2(L))
    B, NT, dev = logits.shape[0], g["NT"], logits.device
    ids = input_ids if input_ids.stride(1) == 1 else input_ids.contiguous()
    L = ids.shape[1]
    e_block = max(32, min(256, next_pow2(_cdiv(L, NT))))  # ~ one block's edits
    edits = _workspace((B, L), torch.int32, dev)
    bnd = _workspace((B, 2, NT), torch.int32, dev)
    _bucket_history_kernel[(B,)](
        ids, ids.stride(0), L, *p["plen"].pair(), edits, bnd, NT, PLEN_T=p["plen"].t,
        TILE=g["TILE"], L_BLOCK=256 if L <= 2048 else 1024, NT_P2=g["NT_P2"], num_warps=8,
        **exact_fp())
    return edits, L, bnd, e_block


def _edits(logits, allowed_words, logit_bias, g):
    """(table, stride): the mask and bias table every block reads (kernels/launch.py
    edit_table), or a dummy when the call has neither."""
    if allowed_words is None and logit_bias is None:
        return [logits, 0]
    ids, values = (None, None) if logit_bias is None else logit_bias
    table = edit_table(allowed_words, ids, values, logits.shape[0], g["NT"], g["TILE"],
                       logits.device)
    return [table, table.stride(0)]


def _penalty_args(c):
    return (*c.p["temp"].pair(), *c.p["rep"].pair(), *c.p["pres"].pair(), *c.p["freq"].pair())


def _launch_stats(c, wf, wi, cand, hb, ft, cnt):
    """Stage 1 (kernels/stats.py), grid (B, C): the one read of the logits."""
    g, L = c.g, c.logits
    # stride_lb / stride_ab are not specialised (kernels/stats.py: one element per thread)
    _stats_kernel[(L.shape[0], g["C"])](
        L, L.stride(0), L.shape[1], g["NT"], g["TPC"], *c.hist, *_penalty_args(c),
        *c.p["topk"].pair(), *c.p["topp"].pair(), *c.p["minp"].pair(), *c.p["seed"].pair(),
        *c.p["off"].pair(), wf, wi, cand, hb, ft, c.top.topw, c.top.rs, cnt, *c.cdargs, c.wc,
        KT=g["KT"], NWIN=8, D0_EXP=-2, BANDS=c.bands, TOPN_KB=c.top.kb, TOPN_RAW=c.top.raw,
        TOPN_REUSE=c.top.reuse,
        num_warps=c.num_warps, R=min(g["TILE"], 32 * c.num_warps),
        **_regs(c.regs),
        **c.flags("topk", "topp", "minp", "seed", "off"), **c.modes, PURE_OK=c.pure_ok,
        GREEDY=c.greedy, GREEDY_ROWS=c.greedy_rows, SHARE=c.second or c.bands, **c.const,
        **exact_fp())


def _launch_merge(c, work, out, band, cnt, write_probs, npiv, max_rounds, keep_list=False):
    """The merge (kernels/merge.py), grid (B,): thresholds, draw, logprob, exact fallback, and
    the band plan of rows it hands to the band read."""
    g, L = c.g, c.logits
    warps = 8 if g["TILE"] >= 1024 else 4
    _merge_kernel[(L.shape[0],)](
        L, L.stride(0), L.shape[1], g["NT"], *c.hist, *c.p["temp"].pair(),
        *c.p["topk"].pair(), *c.p["topp"].pair(), *c.p["minp"].pair(), *c.p["rep"].pair(),
        *c.p["pres"].pair(), *c.p["freq"].pair(), *c.p["seed"].pair(), *c.p["off"].pair(),
        *work, *out, *c.cdargs, c.wc, *band, cnt,
        **c.flags("topk", "topp", "minp", "seed", "off"), **c.modes,
        WRITE_PROBS=write_probs, PURE_OK=c.pure_ok, SECOND=c.second, BANDS=c.bands,
        KT=g["KT"], CB=g["CB"], NT_P2=g["NT_P2"], NPIV=npiv, MAX_ROUNDS=max_rounds,
        NB=256, INV_W=16.0, LB_BLOCK=256, DIRTY_MAX=8, NWIN=8, D0_EXP=-2, STATE=c.top.state,
        KEEP_LIST=keep_list, SCREEN=c.screen, num_warps=warps, R=min(g["TILE"], 32 * warps),
        **_merge_regs(c, L.shape[0], L.device), **c.const, **exact_fp())


def _merge_regs(c, rows, dev):
    """The merge's register cap (MERGE_REGS_*): two programs per SM only matter past one row
    an SM."""
    if c.top.state or "HDIRECT" in c.const:
        return _regs(MERGE_REGS_STATE)
    sms = _sm_count(dev.index or 0) if dev.type == "cuda" else SMS
    return _regs(MERGE_REGS if rows > sms else MERGE_REGS_ONE)


def _second_work(c):
    """The second read's block partials (float32 [B, NQ, NT], int32 [B, NQI, NT])."""
    B, NT, dev = c.logits.shape[0], c.g["NT"], c.logits.device
    return (_workspace((B, NQ.value, NT), torch.float32, dev),
            _workspace((B, NQI.value, NT), torch.int32, dev))


class _Second(NamedTuple):
    """The second read's rows in a call (kernels/second.py): the merge's plan rf, the block
    partials qf / qi, the state sf, write_probs; gather: the band gather reads them too
    (_Call.fuse)."""
    rf: torch.Tensor
    qf: torch.Tensor
    qi: torch.Tensor
    sf: torch.Tensor
    write_probs: bool
    gather: bool


def _launch_second(c, s, tok, logp, cnt, finish):
    """The second read (kernels/second.py): gather, grid (B, C), whose last program of a row
    finishes it (FINISH), unless the band finish does it (``finish`` False); with presence /
    frequency penalties the finish keeps its launch (grid (B,)): the row re-draw, a second
    copy of the gather's block loop, spilled 44 bytes there under the gather's cap. The gather
    is capped at stage 1's 64 registers (8 programs per SM; uncapped it took 93 once its row
    came from second._row_share), but with contrastive decoding (64 spilled 44 bytes there)."""
    g, L = c.g, c.logits
    own = finish and not c.const["HAS_PF"]
    _gather_kernel[(L.shape[0], g["C"])](
        L, L.stride(0), L.shape[1], g["NT"], g["TPC"], cnt, *c.hist, *_penalty_args(c),
        *c.p["minp"].pair(), *c.p["seed"].pair(), *c.p["off"].pair(), s.rf, tok, s.sf, s.qf,
        s.qi, logp, *c.cdargs, **c.flags("minp", "seed", "off"), HAS_MINP=c.modes["HAS_MINP"],
        WRITE_PROBS=s.write_probs, S_ZF=S_ZF, NS=NS, SCREEN=c.screen, FINISH=own,
        S_TAU=S_TAU, STATE=c.top.state, NT_P2=g["NT_P2"], num_warps=c.num_warps,
        **({} if c.const["CD"] else _regs(STATS_REGS)), **c.const, **exact_fp())
    if finish and not own:
        _finish_second(c, s.rf, s.qf, s.qi, tok, logp, s.sf, s.write_probs)


def _finish_second(c, rf, qf, qi, tok, logp, sf, write_probs):
    """The second read's finish (kernels/second.py), grid (B,); the gather's arguments are for
    a row whose screened winner fell below the merge's bound (it re-draws the row)."""
    g, L = c.g, c.logits
    _finish_kernel[(L.shape[0],)](
        L, L.stride(0), L.shape[1], g["NT"], *c.hist, *_penalty_args(c), *c.p["minp"].pair(),
        *c.p["seed"].pair(), *c.p["off"].pair(), rf, qf, qi, tok, logp, sf, *c.cdargs,
        **c.flags("minp", "seed", "off"), HAS_MINP=c.modes["HAS_MINP"], S_TAU=S_TAU, S_ZF=S_ZF,
        NS=NS, WRITE_PROBS=write_probs, NT_P2=g["NT_P2"], STATE=c.top.state, num_warps=4,
        **_regs(FINISH_REGS), **c.const, **exact_fp())


def _launch_band(c, tok, logp, band, xs, wf, cnt, npiv, max_rounds, second=None):
    """The band read (kernels/band.py), planned by the merge: gather (B, C), finish (B,). With
    ``second`` (a _Second: the call can have second-read rows, token -2, disjoint from the
    band's -3 ones) the band finish is their finish too (SECOND), one launch fewer, except in
    a call that keeps a row state (the second read's own finish writes it); with
    ``second.gather`` the band gather is also their gather (neither launch writes what the
    other reads): one more launch fewer."""
    g, L = c.g, c.logits
    B, NT, dev = L.shape[0], g["NT"], L.device
    cap = NT * g["KT"]  # the merge's list workspaces, free once it is done, hold the band
    _, ft, bf, bi, boff, tab = band
    gf = _workspace((B, NG.value, NT), torch.float32, dev)
    gi = _workspace((B, NT), torch.int32, dev)
    # the finish's search list: the band's tokens in tau's bucket (x, id)
    sx, si = _workspace((B, cap), torch.float32, dev), _workspace((B, cap), torch.int32, dev)
    # the finish slices' partials: up to BAND_SLICES a row (more programs than the grid's fp
    # where only some rows are band rows: second._listed_share)
    fp = c.fp
    sp = _workspace((B, NSP.value * BAND_SLICES), torch.float32, dev)
    spi = _workspace((B, NSPI.value * BAND_SLICES), torch.int64, dev)
    sq = (second.rf, second.qf, second.qi) if second else (L, L, L)
    both = second if second and second.gather else None
    _band_gather_kernel[(B, g["C"])](
        L, L.stride(0), L.shape[1], NT, g["TPC"], cap, cnt, *c.hist, *_penalty_args(c),
        *c.p["minp"].pair(), *c.p["seed"].pair(), *c.p["off"].pair(), tok, bf, bi, ft, boff,
        tab, gf, gi, *xs, *sq,
        **c.flags("minp", "seed", "off"), HAS_MINP=c.modes["HAS_MINP"],
        num_warps=c.num_warps, R=min(g["TILE"], 32 * c.num_warps), SECOND=both is not None,
        SCREEN=c.screen, **_gather_regs(c, both), **_band_const(c), **exact_fp())
    if both and c.top.state:
        _finish_second(c, *sq, tok, logp, second.sf, second.write_probs)
    # the row pass's geometry, as the merge's (16 warps modelled slower); round 1 over [512, 8]
    # pivot partials, the later rounds over the survivors [256, 16] (22.8 against 23.2 us)
    warps = 8 if g["TILE"] >= 1024 else 4
    _band_finish_kernel[(B, fp)](
        L, L.stride(0), L.shape[1], NT, cap, *c.hist, *_penalty_args(c), *c.p["topp"].pair(),
        *c.p["minp"].pair(), *c.p["seed"].pair(), *c.p["off"].pair(), tok, logp, bf, bi, tab,
        gf, gi, *xs, sx, si, sp, spi, wf, *sq, cnt, **c.flags("topp", "minp", "seed", "off"),
        HAS_MINP=c.modes["HAS_MINP"], NT_P2=g["NT_P2"], CB=512, NPIV=npiv, SB2=256,
        NPIV2=2 * npiv, MAX_ROUNDS=max_rounds, FP=BAND_SLICES, SEG=64,
        SECOND=second is not None and not c.top.state,
        num_warps=warps, **_regs(MERGE_REGS), **_band_const(c), **exact_fp())


@functools.lru_cache(maxsize=None)
def _sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def _band_programs(B, dev):
    """The band finish's programs per row (a power of 2, <= BAND_SLICES): one wave of its 2
    CTAs per SM (8 warps, ~124 registers) over the batch. Its sums are fixed point, so the
    answer does not depend on it."""
    sms = _sm_count(dev.index or 0) if dev.type == "cuda" else 132
    fp = BAND_SLICES
    while fp > 1 and B * fp > 2 * sms:
        fp //= 2
    return fp


def _gather_regs(c, second=None):
    """The band gather's register cap: 64 (8 programs per SM, as stage 1; B = 64 runs one
    wave) where that spills nothing, GATHER_REGS_PF with presence / frequency penalties,
    GATHER_REGS_WIDE with the second read's gather in the same launch, none with a mask or a
    bias (a cap spills there: kernels/README.md)."""
    if c.const["HAS_MASK"] or c.const["HAS_BIAS"]:
        return {}
    if c.const["HAS_PF"]:
        return _regs(GATHER_REGS_PF)
    return _regs(GATHER_REGS_WIDE if second else 64)


def _band_const(c):
    """The constexprs of c.const that the band kernels take (no contrastive ones: BANDS is
    never on with CD)."""
    return {k: v for k, v in c.const.items() if k not in ("LA_T", "BETA_T", "CD")}


def _launch_probs(c, sf, si):
    """sampling_distribution's rows (kernels/merge.py _write_probs_kernel), grid (B, C)."""
    g, L = c.g, c.logits
    probs = _alloc(tuple(L.shape), torch.float32, L.device)
    _write_probs_kernel[(L.shape[0], g["C"])](
        L, L.stride(0), L.shape[1], g["NT"], g["TPC"], *c.hist, *c.p["temp"].pair(),
        *c.p["minp"].pair(), *c.p["rep"].pair(), *c.p["pres"].pair(), *c.p["freq"].pair(),
        sf, si, probs, probs.stride(0), *c.cdargs, **c.flags("minp"),
        HAS_MINP=c.modes["HAS_MINP"], num_warps=c.num_warps, **c.const, **exact_fp())
    return probs


def _pure_possible(c):
    """Can a row of the call be pure temperature (_modes' rule without the launch kind)?"""
    P, V = c.p, c.logits.shape[1]
    return ((P["topk"].t or not 0 < P["topk"].s < V) and (P["topp"].t or P["topp"].s >= 1.0)
            and (P["minp"].t or P["minp"].s == float("-inf"))
            and (P["temp"].t or P["temp"].s > 0.0))


def _launch_residual(c, sf, si, xs, q, d):
    """Speculative verification's draws (kernels/residual.py): grid (B, C), then (B,); or
    grid (B,) alone where no row can need the parallel second read (pure temperature, min-p
    alone: decided from the Python scalars, like the other modes)."""
    g, L = c.g, c.logits
    B, dev, NT = L.shape[0], L.device, g["NT"]
    q = q if q.stride(2) == 1 else q.contiguous()
    solo = not (c.second or _pure_possible(c))
    # its own chunking: stage 1's scaled to its residency (3 programs per SM against 8: as
    # many waves), so one forced chunk forces it here too; any C gives the same result
    cr = max(1, -(-g["C"] * RESIDUAL_SLOTS // STATS_SLOTS))
    tpc = _cdiv(NT, cr)
    cr = _cdiv(NT, tpc)
    pf = _workspace((B, NP.value, NT), torch.float32, dev)
    pi = _workspace((B, NPI.value, NT), torch.int32, dev)
    tok, logp = _alloc((B,), torch.int64, dev), _alloc((B,), torch.float32, dev)
    pd = _alloc((B,), torch.float32, dev)
    _residual_kernel[(B, 1 if solo else cr)](
        L, L.stride(0), L.shape[1], NT, NT if solo else tpc, *c.hist, *c.p["temp"].pair(),
        *c.p["minp"].pair(), *c.p["rep"].pair(), *c.p["pres"].pair(), *c.p["freq"].pair(),
        *c.p["seed"].pair(), *c.p["off"].pair(), sf, si, *xs, g["KT"],
        q, q.stride(0), q.stride(1), d, d.stride(0), d.shape[1] + 1, pf, pi, tok, logp, pd,
        *c.cdargs, **c.flags("minp", "seed", "off"), HAS_MINP=c.modes["HAS_MINP"], LB=256,
        SOLO=solo, num_warps=8, **_regs(RESIDUAL_REGS), **c.const, **exact_fp())
    if not solo:
        _residual_finish[(B,)](si, pf, pi, tok, logp, pd, NT, cr, NT_P2=g["NT_P2"],
                               num_warps=4, **exact_fp())
    return tok, logp, pd


def fused_sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                 input_ids=None, prompt_lens=None, seed=0, offset=0, write_probs=False,
                 amateur_logits=None, cd_alpha=0.1, cd_beta=0.5, allowed_words=None,
                 logit_bias=None, top_n=0, top_n_raw=True, tile=None, npiv=8, max_rounds=64,
                 num_warps=None, chunks=None, cand=None, plan_batch=None, residual=None):
    """Sample one token per row of ``logits`` [B, V] (or write the distribution).

    Parameters are already validated by the public layer (gpu_sampler.sample): each is a Python
    number for every row or a contiguous (B,) tensor on the logits' device (float32 for float
    parameters, int64 for top_k / prompt_lens / seed / offset). Returns (tokens int64 [B],
    logprobs float32 [B]) or, with ``write_probs``, the float32 [B, V] distribution.
    With ``amateur_logits`` [B, V] (contrastive decoding; cd_alpha / cd_beta validated the same
    way) the rows are the contrastive scores of gpu_sampler/contrastive.py, computed inside the
    same launches: one extra read of the amateur logits, no [B, V] scores in memory.
    ``tile`` (statistics block), ``chunks`` (programs per row in stage 1), ``cand``
    (candidate slots per block) and ``plan_batch`` (plan the chunks for that many rows: the
    GPU model traces 2 rows with a big batch's programs) change the geometry, never the
    result (tests force them).
    ``allowed_words`` (int32 [B, ceil(V / 32)]) and ``logit_bias`` ((ids int64, values
    float32) [B, NB], padding mapped to id 0 / value 0) are a request's mask and bias
    (gpu_sampler/edits.py), applied by every block as it loads its logits: no extra pass.
    ``top_n`` > 0 (<= 64) also returns the N best ids (int64 [B, N]) and logprobs (float32
    [B, N]) of the raw logits (``top_n_raw``) or of the distribution sampled from
    (kernels/topn.py), from the same read: (tokens, logprobs, top_ids, top_logprobs).
    Processed top-N takes no contrastive scores (the public layer materialises them).
    ``residual`` = (draft_probs [B', K, V] float, draft_tokens int64 [B', K]) with
    B = B' (K + 1) (speculative verification, kernels/residual.py): returns (tokens int64 [B],
    logprobs float32 [B], p_d float32 [B]): row b' (K + 1) + i's residual draw against
    draft_probs[b', i] (over p at i = K), its log p, and p at draft_tokens[b', i].
    """
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if top_n and not top_n_raw and amateur_logits is not None:
        raise ValueError("processed top_n with amateur_logits: pass the contrastive scores")
    c = _setup(logits, dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty,
                            presence_penalty=presence_penalty,
                            frequency_penalty=frequency_penalty),
               input_ids, prompt_lens, seed, offset, write_probs or residual is not None,
               (amateur_logits, cd_alpha, cd_beta), (allowed_words, logit_bias),
               (top_n, top_n_raw), dict(tile=tile, chunks=chunks, cand=cand),
               num_warps, plan_batch)
    return _run(c, write_probs or residual is not None, npiv, max_rounds, residual)


def _setup(logits, v, input_ids, prompt_lens, seed, offset, write_probs, cd, edits, top, geom,
           num_warps, plan_batch=None):
    """The call's _Call: modes, plan, parameters, the history and edit tables."""
    (B, V), (amateur_logits, cd_alpha, cd_beta) = logits.shape, cd
    has_rep, has_pf, pure_ok, second, bands, wide, modes = _modes(
        logits, v["temperature"], v["top_k"], v["top_p"], v["min_p"], input_ids,
        v["repetition_penalty"], v["presence_penalty"], v["frequency_penalty"], write_probs,
        amateur_logits is not None, state=bool(top[0]) and not top[1])
    # raw top-N rows whose xp is their raw logits (and that write sampling candidates: no
    # pure-temperature row) share the sampling candidates
    reuse = bool(top[0]) and top[1] and not (has_rep or has_pf or amateur_logits is not None
                                             or pure_ok or edits[0] is not None
                                             or edits[1] is not None)
    per_row = any(isinstance(x, torch.Tensor) for x in (*v.values(), seed, offset))
    regs, slots = _stage1_budget(bool(top[0]), reuse, per_row, wide)
    g = plan(plan_batch or B, V, slots=slots, **geom)
    cdargs, wc, cd_const = _contrastive(logits, amateur_logits, cd_alpha, cd_beta, g["NT"])
    p = _params((prompt_lens if prompt_lens is not None else 0, v["temperature"], v["top_k"],
                 v["top_p"], log_cut(v["min_p"]), v["repetition_penalty"], v["presence_penalty"],
                 v["frequency_penalty"], seed, offset), logits)
    direct = _direct_history(input_ids, g, has_rep, has_pf,
                             second or bands or write_probs or amateur_logits is not None)
    *hist, e_block = _history(logits, input_ids, p, g, has_rep or has_pf, direct)
    hist += _edits(logits, *edits, g)
    const = dict(TEMP_T=p["temp"].t, REP_T=p["rep"].t, PRES_T=p["pres"].t, FREQ_T=p["freq"].t,
                 HAS_REP=has_rep, HAS_PF=has_pf, HAS_MASK=edits[0] is not None,
                 HAS_BIAS=edits[1] is not None, TILE=g["TILE"], E_BLOCK=e_block, **cd_const,
                 **({"HDIRECT": True} if direct else {}))
    # stage 1: small programs, 8 resident per SM at <= 64 registers
    return _Call(logits, g, p, tuple(hist), cdargs, wc, const, modes, pure_ok, second, bands,
                 wide, 4 if num_warps is None else num_warps, _top(logits, g, *top, reuse), regs,
                 second and bands and (plan_batch or B) * g["C"] <= (
                     GATHER_SLOTS_PF if has_pf else GATHER_SLOTS_WIDE),
                 _band_programs(plan_batch or B, logits.device),
                 (plan_batch or B) * g["C"] > SCREEN_PROGRAMS,
                 *_greedy_reads(v["temperature"], write_probs, amateur_logits, top[0]))


def _greedy_reads(temperature, write_probs, amateur_logits, top_n):
    """(every row greedy, greedy rows possible) for the calls whose greedy rows may read as
    greedy blocks (kernels/stats.py _block_greedy: each block's max and first token, no
    exponentials or candidates): only (token, logprob) asked. The distribution, top-N logprobs
    and contrastive decoding need the blocks' partials or candidates. A tensor temperature may
    hold anything."""
    if write_probs or amateur_logits is not None or top_n:
        return False, False
    if isinstance(temperature, torch.Tensor):
        return False, True
    return temperature == 0.0, False


def _stage1_budget(top_n, reuse, per_row, wide):
    """(register cap, resident programs) of stage 1: 64 / 8 per SM; 72 / 7 with both penalty
    kinds and pure rows (``wide``) or raw top-N on the sampling candidates with per-row
    parameters (64 spilled 4 bytes); 128 / 4 with its own top-N candidates (kernels/README.md)."""
    if top_n and not reuse:
        return STATS_REGS_TOPN, STATS_SLOTS_TOPN
    if wide or (reuse and per_row):
        return STATS_REGS_PF, STATS_SLOTS_PF
    return STATS_REGS, STATS_SLOTS


class _BandWork(NamedTuple):
    """The band read's workspaces: stage 1's estimate (counts hb [B, NT, NBIN] int16, tops ft
    [B, NT]) and the merge's plan (bf [B, NBF], bi [B, NBI], block offsets boff [B, NT]), or
    the logits as dummies in a call without the band read."""
    hb: torch.Tensor
    ft: torch.Tensor
    bf: torch.Tensor
    bi: torch.Tensor
    boff: torch.Tensor
    tab: torch.Tensor


def _band_work(c):
    B, NT, dev = c.logits.shape[0], c.g["NT"], c.logits.device
    if not c.bands:
        return _BandWork(*(c.logits,) * 6)
    return _BandWork(_workspace((B, NT, NBIN.value), torch.int16, dev),
                     _workspace((B, NT), torch.float32, dev),
                     _workspace((B, NBF.value), torch.float32, dev),
                     _workspace((B, NBI.value), torch.int32, dev),
                     _workspace((B, NT), torch.int32, dev),
                     _workspace((B, NBUCK.value), torch.int64, dev))


def _run(c, write_probs, npiv, max_rounds, residual=None):
    """The launches of one call, in order; its outputs."""
    g, dev, B = c.g, c.logits.device, c.logits.shape[0]
    NT, KT = g["NT"], g["KT"]
    work = (_workspace((B, NF.value, NT), torch.float32, dev),
            _workspace((B, NI.value, NT), torch.int32, dev),
            _workspace((B, NT, KT), torch.int64, dev))
    band = _band_work(c)
    # the merge's counts of rows that take a second read (kernels/second.py _row_share)
    # the list of rows handed to the second read and its tickets (second._handed_list, _ticket)
    cnt = (_workspace((SHARE_LIST.value + 3 * B,), torch.int32, dev) if c.second or c.bands
           else c.logits)
    _launch_stats(c, *work, band.hb, band.ft, cnt)
    if write_probs:
        sf = _workspace((B, NS.value), torch.float32, dev)
        si = _workspace((B, 2), torch.int32, dev)
        tok = logp = sf  # not written in this mode
    else:
        tok, logp = _alloc((B,), torch.int64, dev), _alloc((B,), torch.float32, dev)
        sf, si = (c.top.sf, c.top.si) if c.top.state else (tok, tok)
    rf = _workspace((B, NR.value), torch.float32, dev) if c.second else c.logits
    xs = (_workspace((B, NT * KT), torch.float32, dev), _workspace((B, NT * KT), torch.int32, dev))
    _launch_merge(c, (*work, *xs), (tok, logp, sf, si, rf), band, cnt, write_probs, npiv,
                  max_rounds, residual is not None)
    # both hand-overs: the band finish finishes both kinds of rows, and with c.fuse one
    # gather launch reads both (kernels/band.py)
    second = _Second(rf, *_second_work(c), sf, write_probs, c.fuse) if c.second else None
    if second and not c.fuse:
        _launch_second(c, second, tok, logp, cnt, finish=not c.bands or c.top.state)
    if c.bands:
        _launch_band(c, tok, logp, band, xs, work[0], cnt, npiv, max_rounds, second)
    if residual is not None:
        return _launch_residual(c, sf, si, xs, *residual)
    if write_probs:
        return _launch_probs(c, sf, si)
    return (tok, logp, *_launch_top_n(c, work[2])) if c.top.kb else (tok, logp)
