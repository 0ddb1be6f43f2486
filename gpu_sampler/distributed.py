"""Vocab-parallel sampling: sample from logits sharded by vocabulary over torch.distributed.

Each rank holds the logits of its own slice of the vocabulary ([B, V_local], global ids
``vocab_start .. vocab_start + V_local``; columns at ids >= ``vocab_size`` are padding and never
sampled). The ranks exchange row statistics and top-C candidates, never the [B, V] logits, and
every rank returns what ``gpu_sampler.sample(torch.cat(shards, 1), backend="torch", ...)``
returns (see docs/distributed.md for what is bit-exact).

How: the torch twin (reference.py) keeps an upper set of the tempered logits, found on its
top-K candidates with K grown x4 until every row's K-th candidate is dropped, and draws by
Gumbel-max with noise that depends only on (seed, offset, global id). The merge of the ranks'
top-C lists is the global top-C, so this module replays the twin's K loop on merged candidates
padded with -inf to the twin's width K (sums over a padded row then have the twin's bits):

    collective 1  all_gather: argument fingerprints and shard bounds (validated before any data
                  moves; an error on one rank raises on every rank)
    collective 2  all_gather: per row max / argmax / partial exp-sum, the seeds drawn on rank 0
                  (generator path), and each rank's top-C0 candidates
    rare rounds   all_gather: more candidates for rows whose C-th candidate is still kept
                  (top-k / top-p rows), one round of per-rank draw statistics for rows kept by
                  an elementwise rule (no top-k, no top-p: min-p, plain sampling, overflow), and
                  the full rows of the few top-p rows whose cut-off sits within fp32 rounding
                  of the total mass (so the twin's full-row logsumexp can be replayed exactly).

In code: _run validates and agrees (collective 1), then _pipeline runs the steps
_local_statistics (no collective), _first_exchange (collective 2), _sampling_rows (no
collective), _candidate_rounds (the rare rounds) and _draw or _distribution, then _finish.
The gathered tables have named columns: _Meta (collective 1), _Row (collective 2), _Ew (the
elementwise round).
"""
import dataclasses
import enum
import math
import numbers
from typing import List, NamedTuple, Optional

import torch
import torch.distributed as dist

from . import edits, params, reference, rng
from .sampler import SampleOutput

_F32 = torch.float32
_NEG = float("-inf")
_EPS = torch.finfo(torch.float32).eps

# What this process sent, for bench/ and tests: bytes (payload x (world - 1), as a ring
# all_gather sends), collectives, escalation rounds and full-row gathers.
stats = dict(bytes_sent=0, collectives=0, escalations=0, full_rows=0)


# ---------------------------------------------------------------- gathered tables

# Collective 1: one int64 row per rank. Member names are what error messages call the
# arguments; the sampling parameters follow params.SAMPLING_NAMES, so a parameter added there
# gets its own column.
_Meta = enum.IntEnum("_Meta", ["error", "B", "vocab_size", "vocab_start", "n_real", "V_local",
                               "history_width", "check", "draw_seeds", *params.SAMPLING_NAMES,
                               "input_ids", "prompt_lens", "seed", "offset", "top_logprobs",
                               "logprobs_mode", "allowed_mask", "logit_bias"], start=0)
# Wider than _Meta (two spare columns): the row's size is part of what every call sends.
_META_WIDTH = 26
assert len(_Meta) <= _META_WIDTH
# Columns that describe the rank's own shard; every other column must agree across ranks.
_PER_RANK = (_Meta.error, _Meta.vocab_start, _Meta.n_real, _Meta.V_local)
_LABELS = {_Meta.history_width: "input_ids width", _Meta.draw_seeds: "seeds drawn"}


class _Row(enum.IntEnum):
    """Collective 2's int32 columns per (rank, row), after the candidates when there are some."""
    MAX = 0      # float32 bits: max of the rank's penalised logits
    ARGMAX = 1   # global id of that max (lowest on the rank's ties)
    EXP_SUM = 2  # float32 bits: sum exp(x / T - max / T) over the rank (rows needing Z only)
    SEED = 3     # int64 seed drawn on the rank, as two int32 columns (SEED, SEED + 1)


_ROW_WIDTH = _Row.SEED + 2


class _Ew(enum.IntEnum):
    """The elementwise round's float64 columns per (rank, row)."""
    COUNT = 0  # kept tokens of the rank
    MASS = 1   # their sum of exp(x - M)
    SCORE = 2  # best Gumbel score among them (-inf: none kept)
    TOKEN = 3  # its global id (-1: the rank has no real column)
    REL = 4    # its x - M


# ---------------------------------------------------------------- collectives

class _Comm(NamedTuple):
    group: object
    device: torch.device  # where the backend wants tensors (NCCL: the current CUDA device)


def _comm_device(group, logits):
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather(t, comm):
    """all_gather of one tensor: [W, *t.shape] on t's device."""
    W = dist.get_world_size(comm.group)
    src = t.contiguous().to(comm.device)
    out = [torch.empty_like(src) for _ in range(W)]
    dist.all_gather(out, src, group=comm.group)
    stats["bytes_sent"] += src.numel() * src.element_size() * (W - 1)
    stats["collectives"] += 1
    return torch.stack(out).to(t.device)


def _f32_bits(t):
    return t.to(_F32).contiguous().view(torch.int32)


def _bits_f32(t):
    return t.contiguous().view(_F32)


# ---------------------------------------------------------------- validation

def _fingerprint(v):
    """An int64 summary of a parameter, equal on ranks that were given equal values."""
    if v is None:
        return 7
    if isinstance(v, torch.Tensor):
        t = v.detach().reshape(-1)
        if t.dtype.is_floating_point:
            t = t.to(torch.float64).view(torch.int64)
        t = t.to(torch.int64)
        w = torch.arange(1, t.numel() + 1, dtype=torch.int64, device=t.device)
        w = w * -7046029254386353131  # odd multiplier: position-sensitive, wraps in int64
        return (int((t * w).sum()) ^ (t.numel() << 40)) & ((1 << 62) - 1)
    return hash(v) & ((1 << 62) - 1)


def _shard_int(v):
    """A numpy integer scalar as a Python int, as sample() takes them (_validate_local checks
    the result); anything else unchanged."""
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v


def _validate_local(local_logits, vocab_start, vocab_size, values, input_ids, prompt_lens,
                    generator, seed, offset, check, backend):
    """The checks of ``params.normalise`` plus the shard arguments; raises ValueError."""
    for name, v in (("vocab_start", vocab_start), ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if vocab_start < 0:
        raise ValueError(f"vocab_start must be >= 0, got {vocab_start}")
    params.check_logits(local_logits, backend, name="local_logits")  # errors name it as such
    # top_k >= V keeps all and history ids must be < V: both against the *global* vocabulary.
    p, _, prompt_lens, seed, offset = params.normalise(
        local_logits, values, input_ids, prompt_lens, generator, seed, offset, check, backend,
        vocab_size=vocab_size)
    return p, prompt_lens, seed, offset


def _fingerprints(local_logits, vocab_start, vocab_size, p, input_ids, prompt_lens, seed, offset,
                  check, draw_seeds, want_draw):
    """This rank's row of the argument table: {_Meta column: int}."""
    B, V_local = local_logits.shape
    meta = {_Meta.B: B, _Meta.vocab_size: vocab_size, _Meta.vocab_start: vocab_start,
            _Meta.n_real: max(0, min(V_local, vocab_size - vocab_start)), _Meta.V_local: V_local,
            _Meta.history_width: -1 if input_ids is None else input_ids.shape[1],
            _Meta.check: int(check), _Meta.draw_seeds: int(draw_seeds)}
    meta.update({_Meta[n]: _fingerprint(getattr(p, n)) for n in params.SAMPLING_NAMES})
    # sampling_distribution draws nothing: its seed and offset must not make ranks disagree.
    meta.update({_Meta.input_ids: _fingerprint(input_ids),
                 _Meta.prompt_lens: _fingerprint(prompt_lens),
                 _Meta.seed: _fingerprint(seed if want_draw else None),
                 _Meta.offset: _fingerprint(offset if want_draw else None)})
    return meta


def _agree(comm, err, meta):
    """Collective 1: every rank learns every rank's fingerprints; any error raises everywhere.

    Returns the gathered [W, _META_WIDTH] int64 table (columns: _Meta)."""
    row = torch.zeros(_META_WIDTH, dtype=torch.int64)
    if err is None:
        for c, v in meta.items():
            row[c] = v
    else:
        row[_Meta.error] = 1
    table = _gather(row, comm)
    bad = table[:, _Meta.error].nonzero()
    # `bad` is read from the gathered table: every rank broadcasts and raises, or none does.
    if bad.numel():
        src = int(bad[0, 0])
        msg = [str(err) if err is not None else None]
        dist.broadcast_object_list(msg, src=dist.get_global_rank(comm.group, src),
                                   group=comm.group, device=comm.device)
        raise ValueError(f"{msg[0]} (raised on rank {src} of the group)")
    return table


def _check_table(table):
    """Rank-symmetric checks on the gathered fingerprints (no collective: same data everywhere)."""
    for c in _Meta:
        if c in _PER_RANK:
            continue
        if not bool((table[:, c] == table[0, c]).all()):
            ranks = (table[:, c] != table[0, c]).nonzero()[0, 0].item()
            raise ValueError(f"{_LABELS.get(c, c.name)} differs between rank 0 and rank {ranks}: "
                             "every rank must pass the same arguments (only local_logits / "
                             "vocab_start differ)")
    V = int(table[0, _Meta.vocab_size])
    starts, reals = table[:, _Meta.vocab_start].tolist(), table[:, _Meta.n_real].tolist()
    spans = sorted((s, n) for s, n in zip(starts, reals) if n > 0)
    pos = 0
    for s, n in spans:
        if s != pos:
            raise ValueError(f"the shards must tile [0, vocab_size={V}) without gaps or overlaps: "
                             f"got vocab_start values {starts} with {reals} real columns")
        pos += n
    if pos != V:
        raise ValueError(f"the shards cover ids [0, {pos}) but vocab_size={V}: got vocab_start "
                         f"values {starts} with {reals} real columns")


# ---------------------------------------------------------------- the twin's rules on candidates

class _Config(reference.Switches):
    """The twin's per-call switches (reference.Switches) plus the first gather width."""
    __slots__ = ("C0",)

    def __init__(self, V, top_k, top_p, min_p):
        super().__init__(V, top_k, top_p, min_p)
        kmax_act = 0
        if self.k_any:
            kmax_act = int(torch.where(self.kact, top_k, 0).max()) if self.k_tensor else top_k
        self.C0 = min(self.K0, max(reference.K0, kmax_act + 1))

    def rows(self, v, B, dev):
        """A per-row bool from a scalar switch or a [B] / [B, 1] tensor."""
        if isinstance(v, torch.Tensor):
            return v.reshape(B).to(dev)
        return torch.full((B,), bool(v), device=dev)

    def z_full_rows(self, B, dev):
        """Rows whose top-p total is the full-row mass (no active top-k) and that use it."""
        if not self.p_any:
            return torch.zeros(B, dtype=torch.bool, device=dev)
        kin = ~self.rows(self.kact, B, dev)
        return kin & self.rows(self.p_on, B, dev)


def _divide(v, tdiv):
    if isinstance(tdiv, torch.Tensor) or tdiv != 1.0:
        return v / tdiv
    return v


def _sub(v, rows):
    return v[rows] if isinstance(v, torch.Tensor) else v


def _widen(cv, ci, K):
    """Merged candidates padded with -inf (id 0) to at least K columns."""
    B, C = cv.shape
    if C >= K:
        return cv, ci
    cv = torch.cat([cv, torch.full((B, K - C), _NEG, device=cv.device)], 1)
    ci = torch.cat([ci, torch.zeros((B, K - C), dtype=torch.int64, device=ci.device)], 1)
    return cv, ci


def _z_interval(z_est, M, V):
    """fp32 bounds on the twin's full-row mass (the fp32 sum of exp(x - M)), from an estimate.

    Sized when the twin took exp(logsumexp(x) - M): its fp32 lse rounding (half an ulp of
    |lse|) plus the cascade sum's few eps (growing with log2 V), twice the measured errors (V up
    to 151936, |M| up to 440, 2-4 shards). The direct sum errs by the cascade term alone, so the
    bounds hold with room; a wider interval only gathers more rows in full.
    """
    lse = (M.double() + torch.log(z_est)).abs().clamp_min(1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(lse)) - 23)
    t = 2 * (ulp + 4 * _EPS * (1 + 0.25 * math.log2(V)))
    lo = (z_est * torch.exp(-t) * (1 - _EPS)).to(_F32)
    hi = (z_est * torch.exp(t) * (1 + _EPS)).to(_F32)
    return lo, hi


# ---------------------------------------------------------------- state that crosses the steps

@dataclasses.dataclass(frozen=True)
class _Shard:
    """This rank's penalised slice and where every rank's slice lies (from the agreed table)."""
    x: torch.Tensor  # float32 [B, n_real]
    start: int       # global id of column 0
    starts: list     # every rank's vocab_start
    reals: list      # every rank's count of real columns

    @property
    def width(self):
        return max(max(self.reals), 1)


@dataclasses.dataclass(frozen=True)
class _Local:
    """Step 1: what this rank knows before any data moves."""
    shard: _Shard
    cfg: _Config
    valid: torch.Tensor      # [B] bool: every per-row parameter valid
    greedy: torch.Tensor     # [B] bool: T == 0
    all_greedy: bool
    tdiv: object             # x's divisor: a float or [B, 1] (1 on greedy and invalid rows)
    zrows: Optional[torch.Tensor]  # [B] bool: top-p rows measured against the full-row mass
    need_lse: bool           # some row of zrows exists: collective 2 carries exp sums


class _RowStats(NamedTuple):
    """Step 2: the merged row statistics and first candidates, identical on every rank."""
    gmx: torch.Tensor     # [B] max penalised logit over the vocabulary (NaN ignored)
    gtok: torch.Tensor    # [B] its global id, lowest on ties
    nanrow: torch.Tensor  # [B] bool: a NaN on some rank
    m_all: torch.Tensor   # [W, B] each rank's max
    s_all: torch.Tensor   # [W, B] each rank's exp sum (_Row.EXP_SUM)
    cv: Optional[torch.Tensor]  # [B, C] merged top-C values (None: every row greedy)
    ci: Optional[torch.Tensor]  # [B, C] their global ids
    seed: object
    offset: object


class _EwResult(NamedTuple):
    """One elementwise round, for its rows."""
    rows: torch.Tensor   # [R] row indices
    count: torch.Tensor  # [R] float64 kept tokens over all ranks
    Z: torch.Tensor      # [R] float32 kept mass
    tok: torch.Tensor    # [R] drawn global id (-1: nothing kept)
    logp: torch.Tensor   # [R]
    keep: torch.Tensor   # [R, n_real] this rank's kept columns
    e: torch.Tensor      # [R, n_real] their exp(x - M)


@dataclasses.dataclass
class _Rounds:
    """Steps 3 and 4: the sampling rows through the candidate rounds (mutated in place)."""
    shard: _Shard
    cfg: _Config
    gmx: torch.Tensor
    M: torch.Tensor          # [B] max of x / T (0 on overflow rows)
    tdiv: object             # loc.tdiv with overflow rows at 1
    overflow: torch.Tensor   # [B] x / T overflowed: the argmax tie group is kept
    sampling: torch.Tensor   # [B] rows drawn at random
    kin: torch.Tensor        # [B] no active top-k
    elementwise: torch.Tensor  # [B] no top-k, no top-p: kept by an elementwise rule
    zrows: Optional[torch.Tensor]
    cand: torch.Tensor       # [B] rows decided on the merged candidates
    ew_rows: torch.Tensor    # [B] rows decided by an elementwise round
    cv: torch.Tensor         # [B, C] merged candidates (values), grown by escalation
    ci: torch.Tensor         # [B, C] their global ids
    have: torch.Tensor       # [B] exact leading candidates per row (V: all of the row)
    z_lo: Optional[torch.Tensor]  # [B] bounds on the full-row mass (None: no row needs it)
    z_hi: Optional[torch.Tensor]
    z_exact: Optional[torch.Tensor]  # [B] the mass from a full-row gather, where `exact`
    exact: torch.Tensor
    ew_done: torch.Tensor    # [B] rows whose elementwise round has run
    ew_count: torch.Tensor   # [B] float64 their kept counts
    ew_results: List[_EwResult] = dataclasses.field(default_factory=list)


class _Window(NamedTuple):
    """The twin's filter on the merged candidates at width K."""
    vals: torch.Tensor  # [B, K] x / T, descending, -inf padded
    ids: torch.Tensor   # [B, K] global ids
    keep: torch.Tensor  # [B, K] bool
    e: torch.Tensor     # [B, K] exp(x - M) of kept candidates
    last: torch.Tensor  # [B] bool: no token past the window can be kept


@dataclasses.dataclass
class _Outcome:
    tok: torch.Tensor    # [B] int64
    logp: torch.Tensor   # [B] float32
    probs: Optional[torch.Tensor]  # [B, V_local] (sampling_distribution), None (sample)


# ---------------------------------------------------------------- exchanges

def _gather_top(shard, rows, C, comm, extra=None):
    """All ranks' top-C (xp value, global id) of `rows`, merged: ([R, C] values, [R, C] ids),
    plus the gathered `extra` int32 columns [W, R, E] when given."""
    x = shard.x if rows is None else shard.x[rows]
    R, n = x.shape
    c = min(C, n)
    vals = torch.full((R, C), _NEG, device=x.device)
    ids = torch.zeros((R, C), dtype=torch.int32, device=x.device)
    if c > 0:
        v, i = torch.topk(x, c, dim=1)
        vals[:, :c] = v
        ids[:, :c] = (i + shard.start).to(torch.int32)
    parts = [_f32_bits(vals), ids] + ([extra] if extra is not None else [])
    allp = _gather(torch.cat(parts, 1), comm)  # [W, R, C value bits | C ids | extra]
    W = allp.shape[0]
    av = _bits_f32(allp[:, :, :C]).permute(1, 0, 2).reshape(R, W * C)
    ai = allp[:, :, C:2 * C].permute(1, 0, 2).reshape(R, W * C)
    mv, j = torch.topk(av, C, dim=1)
    mi = ai.gather(1, j).to(torch.int64)
    return mv, mi, (allp[:, :, 2 * C:] if extra is not None else None)


def _pack_row_stats(mx, arg, s_loc, seeds):
    """Collective 2's int32 columns (_Row) of this rank."""
    out = torch.empty(mx.shape[0], _ROW_WIDTH, dtype=torch.int32, device=mx.device)
    out[:, _Row.MAX] = _f32_bits(mx)
    out[:, _Row.ARGMAX] = arg.to(torch.int32)
    out[:, _Row.EXP_SUM] = _f32_bits(s_loc)
    out[:, _Row.SEED:] = seeds
    return out


def _unpack_row_stats(st):
    """[W, B, _ROW_WIDTH] -> (max [W, B], argmax [W, B] int64, exp sum [W, B], rank 0's seeds)."""
    return (_bits_f32(st[:, :, _Row.MAX]), st[:, :, _Row.ARGMAX].to(torch.int64),
            _bits_f32(st[:, :, _Row.EXP_SUM]),
            # a copy of its own: with B == 1 the slice counts as contiguous, so .contiguous()
            # keeps its odd storage offset and .view(int64) raised RuntimeError
            st[0, :, _Row.SEED:].reshape(-1).clone().view(torch.int64))


def _full_rows(shard, rows, comm):
    """The full penalised rows [R, V] (rare: top-p rows whose cut-off is within rounding)."""
    x = shard.x[rows]
    R = x.shape[0]
    buf = torch.full((R, shard.width), _NEG, device=x.device)
    buf[:, :x.shape[1]] = x
    allx = _gather(buf, comm)
    V = sum(shard.reals)
    full = torch.empty((R, V), device=x.device)
    for s, n, part in zip(shard.starts, shard.reals, allx):
        if n > 0:
            full[:, s:s + n] = part[:, :n]
    return full


# ---------------------------------------------------------------- step 1: local statistics

def _penalised_shard(local_logits, n_real, vocab_start, p, input_ids, prompt_lens):
    """fp32 copy of the real columns with the penalties of the global history ids."""
    x = local_logits[:, :n_real].to(_F32)
    if input_ids is None or input_ids.shape[1] == 0 or n_real == 0:
        return x
    has_rep, has_pf = p.has_repetition(), p.has_presence_frequency()
    if has_rep or has_pf:
        x = x.clone() if x.data_ptr() == local_logits.data_ptr() else x
        g = input_ids.to(torch.int64) - vocab_start
        local_ids = torch.where((g >= 0) & (g < n_real), g, -1)
        reference.apply_penalties(x, local_ids, prompt_lens if prompt_lens is not None else 0,
                                  p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
                                  has_rep, has_pf)
    return x


def _local_statistics(local_logits, table, rank, vocab_start, V, p, input_ids, prompt_lens):
    """Step 1 (no collective): the penalised fp32 shard and the twin's row switches."""
    B = local_logits.shape[0]
    dev = local_logits.device
    n_real = int(table[rank, _Meta.n_real])
    x = _penalised_shard(local_logits, n_real, vocab_start, p, input_ids, prompt_lens)
    shard = _Shard(x, vocab_start, table[:, _Meta.vocab_start].tolist(),
                   table[:, _Meta.n_real].tolist())
    T = p.temperature
    bad = p.bad_rows()
    valid = torch.ones(B, dtype=torch.bool, device=dev) if bad is None else ~bad
    if isinstance(T, torch.Tensor):
        greedy = T == 0
    else:
        greedy = torch.full((B,), T == 0, device=dev)
    all_greedy = bool(greedy.all())
    cfg = _Config(V, p.top_k, p.top_p, p.min_p)
    tdiv = (torch.where(~valid | greedy, 1.0, T)[:, None] if isinstance(T, torch.Tensor)
            else float(T) if not all_greedy else 1.0)
    zrows = cfg.z_full_rows(B, dev) & ~greedy if not all_greedy else None
    need_lse = zrows is not None and bool(zrows.any())
    return _Local(shard, cfg, valid, greedy, all_greedy, tdiv, zrows, need_lse)


# ---------------------------------------------------------------- step 2: the first exchange

def _first_exchange(loc, V, draw_seeds, generator, seed, offset, comm):
    """Step 2, collective 2: per row max / argmax / exp sum, rank 0's seeds and the first
    merged candidates; the greedy answer (lowest id among the global max) falls out of it."""
    x, start = loc.shard.x, loc.shard.start
    B, n_real = x.shape
    dev = x.device
    if n_real > 0:
        mx = x.amax(1)
        arg = x.argmax(1) + start
    else:
        mx = torch.full((B,), _NEG, device=dev)
        arg = torch.full((B,), start, dtype=torch.int64, device=dev)
    s_loc = torch.zeros(B, device=dev)
    if loc.need_lse and n_real > 0:
        m_loc = _divide(mx[:, None], loc.tdiv)[:, 0]
        s_loc = torch.exp(_divide(x, loc.tdiv) - m_loc[:, None]).sum(1)
    seeds = torch.zeros(B, 2, dtype=torch.int32, device=dev)
    if draw_seeds:  # every rank draws, so that identically seeded generators stay in step
        seeds = params.draw_seeds(B, dev, generator, True).view(torch.int32).view(B, 2)
    packed = _pack_row_stats(mx, arg, s_loc, seeds)
    C = 0 if loc.all_greedy else min(loc.cfg.C0, V)
    cv = ci = None
    # C follows from temperature and top_k, which _agree checked are equal on every rank:
    # every rank gathers the same width.
    if C > 0:
        cv, ci, st = _gather_top(loc.shard, None, C, comm, packed)
    else:
        st = _gather(packed, comm)
    m_all, arg_all, s_all, drawn = _unpack_row_stats(st)
    nanrow = m_all.isnan().any(0)
    score = torch.where(m_all.isnan(), _NEG, m_all).T  # [B, W]
    gtok, _ = rng.first_best(score, arg_all.T, V)
    if draw_seeds:
        seed, offset = drawn, 0
    return _RowStats(score.amax(1), gtok, nanrow, m_all, s_all, cv, ci, seed, offset)


# ---------------------------------------------------------------- step 3: the sampling rows

def _sampling_rows(loc, rs, V):
    """Step 3 (no collective): which rows are drawn and how; the full-row mass bounds."""
    cfg, tdiv = loc.cfg, loc.tdiv
    B, C = rs.cv.shape
    dev = rs.cv.device
    M = _divide(rs.gmx[:, None], tdiv)[:, 0]
    # x / T overflowed to +inf, or to -inf while the max logit is finite (the twin's
    # _overflow_rows: tiny T on a row whose logits are all negative): the argmax tie group
    overflow = M.isinf() & (rs.gmx > _NEG) & loc.valid & ~loc.greedy & ~rs.nanrow
    M = torch.where(overflow, 0.0, M)
    sampling = (M > _NEG) & loc.valid & ~loc.greedy & ~rs.nanrow
    tdiv_c = tdiv
    if bool(overflow.any()):
        tdiv_c = torch.where(overflow[:, None], 1.0, tdiv if isinstance(tdiv, torch.Tensor)
                             else torch.full((B, 1), tdiv, device=dev))
    kin = ~cfg.rows(cfg.kact, B, dev)
    ew_rows = overflow.clone()
    z_lo = z_hi = z_exact = None
    if loc.need_lse:
        m_all = _divide(rs.m_all.T.contiguous(), tdiv)  # [B, W]
        s_all = rs.s_all.T
        ok = m_all > _NEG
        z_est = torch.where(ok, s_all.double() * torch.exp(m_all.double() - M.double()[:, None]),
                            0.0).sum(1)
        z_lo, z_hi = _z_interval(z_est, M, V)
        z_exact = torch.zeros(B, device=dev)
    have = torch.full((B,), C, dtype=torch.int64, device=dev)
    have = torch.where((rs.cv[:, -1] == _NEG) | (C >= V), V, have)
    return _Rounds(
        shard=loc.shard, cfg=cfg, gmx=rs.gmx, M=M, tdiv=tdiv_c, overflow=overflow,
        sampling=sampling, kin=kin, elementwise=kin & ~cfg.rows(cfg.p_on, B, dev),
        zrows=loc.zrows, cand=sampling & ~ew_rows, ew_rows=ew_rows, cv=rs.cv, ci=rs.ci,
        have=have, z_lo=z_lo, z_hi=z_hi, z_exact=z_exact,
        exact=torch.zeros(B, dtype=torch.bool, device=dev),
        ew_done=torch.zeros(B, dtype=torch.bool, device=dev),
        ew_count=torch.zeros(B, dtype=torch.float64, device=dev))


# ---------------------------------------------------------------- step 4: candidate rounds

def _window(st, K):
    """The merged candidates at the twin's width K, divided by T (overflow rows: their argmax
    tie group at 0, the rest -inf; the elementwise round decides them)."""
    v, i = _widen(st.cv, st.ci, K)
    v, i = v[:, :K], i[:, :K]
    if bool(st.overflow.any()):
        v = torch.where(st.overflow[:, None], torch.where(v == st.gmx[:, None], 0.0, _NEG), v)
    return _divide(v, st.tdiv), i


def _filter_window(st, vk):
    """reference.filter_candidates at the lower full-row mass bound, and the rows that the
    upper bound would filter otherwise (None: no row uses the full-row mass)."""
    zf = torch.zeros(vk.shape[0], device=vk.device)  # unused by every row when no row needs it
    if st.z_lo is not None:
        zf = torch.where(st.exact, st.z_exact, st.z_lo)
    keep, e, tau_k, last = reference.filter_candidates(vk, st.cfg, lambda: zf)
    if st.z_lo is None:
        return keep, e, tau_k, last, None
    keep2, _, _, last2 = reference.filter_candidates(
        vk, st.cfg, lambda: torch.where(st.exact, st.z_exact, st.z_hi))
    amb = st.cand & st.zrows & ~st.exact & ((keep != keep2).any(1) | (last != last2))
    return keep, e, tau_k, last, amb


def _full_row_round(st, r, comm):
    """The exact full-row mass of rows `r`, from their gathered rows: the twin's fp32 sum."""
    full = _full_rows(st.shard, r, comm)
    stats["full_rows"] += r.numel()
    rr = torch.cat([r, r[:1]]) if r.numel() == 1 else r
    fr = torch.cat([full, full[:1]]) if r.numel() == 1 else full
    # the twin's full-row mass is the fp32 sum of exp(x / T - M) (reference._filter's z_full,
    # since 34ddc60), not exp(logsumexp(x / T) - M): replay that sum
    z = torch.exp(_divide(fr, _sub(st.tdiv, rr)) - st.M[rr][:, None]).sum(1)
    st.z_exact[r] = z[:r.numel()]
    st.exact[r] = True


def _escalate(st, r, V, comm):
    """Four times more merged candidates for rows `r` (their last candidate is still kept)."""
    C2 = min(V, 4 * max(int(st.have[r].max()), 1))
    mv, mi, _ = _gather_top(st.shard, r, C2, comm)
    stats["escalations"] += 1
    st.cv, st.ci = _widen(st.cv, st.ci, C2)
    st.cv[r, :C2], st.ci[r, :C2] = mv, mi
    st.cv[r, C2:] = _NEG
    st.have[r] = torch.where((mv[:, -1] == _NEG) | (C2 >= V), V, C2)


def _settle_window(st, K, V, comm):
    """The filter at width K once no row needs a rare round: full rows for rows whose top-p
    cut-off the mass bounds cannot place, more candidates for rows whose window is too short
    (elementwise rows go to the elementwise round instead)."""
    while True:
        vk, ik = _window(st, K)
        keep, e, tau_k, last, amb = _filter_window(st, vk)
        # amb (None unless the agreed top_k / top_p / temperature need the full-row mass),
        # insuff and esc come from merged candidates and gathered sums, by the same ops on
        # every rank, and from parameters _agree checked: every rank takes the same rounds.
        if amb is not None and bool(amb.any()):
            _full_row_round(st, amb.nonzero().squeeze(1), comm)
            continue
        pos = (st.have.clamp_max(K) - 1)[:, None]
        dropped = ~keep.gather(1, pos).squeeze(1)
        if tau_k is not None:
            below = vk.gather(1, pos) < tau_k
            dropped &= below.squeeze(1) | st.kin
        insuff = st.cand & ~((st.have >= K) | dropped)
        to_ew = insuff & st.elementwise
        st.ew_rows |= to_ew
        st.cand &= ~to_ew
        esc = insuff & ~st.elementwise
        if bool(esc.any()):
            _escalate(st, esc.nonzero().squeeze(1), V, comm)
            continue
        return _Window(vk, ik, keep, e, last)


def _elementwise_round(st, rows, seed, offset, comm):
    """Rows kept by an elementwise rule: per rank, the kept count and mass and the Gumbel-max
    of its kept tokens; merged into (count, Z float64, token, logprob) per row."""
    x = st.shard.x[rows]
    R, n = x.shape
    dev = x.device
    of = st.overflow[rows][:, None]
    y = _divide(x, _sub(st.tdiv, rows))
    Mr = st.M[rows][:, None]
    e = torch.exp(y - Mr)
    keep = y > _NEG
    if st.cfg.mp_on:
        keep = keep & ((y - Mr) >= _sub(reference.col(st.cfg.log_min_p), rows))
    # Overflow rows keep their argmax tie group at value 0 (the T -> 0 limit, GUIDE rule).
    keep = torch.where(of, x == st.gmx[rows][:, None], keep)
    e = torch.where(of, 1.0, e)
    rel = torch.where(of, 0.0, y - Mr)
    stat = torch.zeros(R, len(_Ew), dtype=torch.float64, device=dev)
    stat[:, _Ew.TOKEN] = -1
    stat[:, _Ew.SCORE] = _NEG
    if n > 0:
        gid = torch.arange(n, device=dev)[None, :] + st.shard.start
        if seed is None:  # sampling_distribution: no draw, any kept token marks the row
            score = torch.where(keep, 0.0, _NEG)
        else:
            g = rng.gumbel_rows(_sub(seed, rows), _sub(offset, rows),
                                gid.expand(R, n).contiguous())
            score = torch.where(keep, rel + g, _NEG)
        tok, j = rng.first_best(score, gid.expand(R, n), st.shard.start + n)
        stat[:, _Ew.COUNT] = keep.sum(1).double()
        stat[:, _Ew.MASS] = torch.where(keep, e, 0.0).double().sum(1)
        stat[:, _Ew.SCORE] = score.gather(1, j).squeeze(1).double()
        stat[:, _Ew.TOKEN] = tok.double()
        stat[:, _Ew.REL] = rel.gather(1, j).squeeze(1).double()
    allst = _gather(stat, comm)  # [W, R, _Ew]
    # The draw over the ranks' winners: the same tie rule, on the gathered (score, id) pairs.
    score = allst[:, :, _Ew.SCORE].T
    tok, j = rng.first_best(score, allst[:, :, _Ew.TOKEN].T, math.inf)
    rel_tok = allst[:, :, _Ew.REL].T.gather(1, j).squeeze(1).to(_F32)
    Z32 = allst[:, :, _Ew.MASS].sum(0).to(_F32)
    ok = score.gather(1, j).squeeze(1) > _NEG
    return _EwResult(rows, allst[:, :, _Ew.COUNT].sum(0), Z32,
                     torch.where(ok, tok.to(torch.int64), -1), rel_tok - torch.log(Z32), keep, e)


def _twin_stops(st, win, K):
    """The twin's stop rule at width K: every sampling row's K-th candidate is dropped."""
    last_ew = st.ew_count < K
    if st.cfg.k_any:
        kk = st.cfg.top_k.double() if st.cfg.k_tensor else st.cfg.top_k
        short = st.overflow & ~st.kin & (st.ew_count < kk)
        last_ew &= ~short
    last_all = torch.where(st.ew_rows, last_ew, win.last)
    return bool((last_all | ~st.sampling).all())


def _candidate_rounds(st, V, seed, offset, comm):
    """Step 4: the twin's K loop (K0, x4, ... V) on merged candidates. Returns the final K
    and the filter there; the elementwise rows' draws are in st.ew_results."""
    K = st.cfg.K0
    while True:
        win = _settle_window(st, K, V, comm)
        todo = st.ew_rows & st.sampling & ~st.ew_done
        # todo and the stop rule read merged candidates, gathered counts and agreed parameters:
        # every rank runs the same elementwise rounds and leaves the loop at the same K.
        if bool(todo.any()):
            r = todo.nonzero().squeeze(1)
            res = _elementwise_round(st, r, seed, offset, comm)
            st.ew_count[r] = res.count
            st.ew_done[r] = True
            st.ew_results.append(res)
        if K == V or _twin_stops(st, win, K):
            return K, win
        K = min(V, K * 4)


# ---------------------------------------------------------------- step 5: finish

def _draw(st, win, K, V, seed, offset, out):
    """Tokens and logprobs of the sampling rows: the twin's Gumbel-max over the kept merged
    candidates, or the elementwise round's draw."""
    keep = win.keep & (st.cand & st.sampling)[:, None]
    ssum = reference.window_mass(torch.where(keep, win.e, 0.0))  # the twin's Z, bit for bit
    if bool(st.cand.any()):
        w = min(K, int(st.have[st.cand].max()))
        kw, vw, iw = keep[:, :w], win.vals[:, :w], win.ids[:, :w]
        g = rng.gumbel_rows(seed, offset, iw)
        score = torch.where(kw, (vw - st.M[:, None]) + g, _NEG)
        t, j = rng.first_best(score, iw, V)
        lp = (vw.gather(1, j).squeeze(1) - st.M) - torch.log(ssum)
        out.tok = torch.where(st.cand, t, out.tok)
        out.logp = torch.where(st.cand, lp, out.logp)
    for res in st.ew_results:
        out.tok[res.rows], out.logp[res.rows] = res.tok, res.logp


def _distribution(st, win, out):
    """This rank's columns of the sampling rows' kept distribution."""
    keep = win.keep & (st.cand & st.sampling)[:, None]
    kept_e = torch.where(keep, win.e, 0.0)
    z = reference.window_mass(kept_e, keepdim=True).clamp_min(torch.finfo(_F32).tiny)
    n_real = st.shard.x.shape[1]
    loc = win.ids - st.shard.start
    inside = (loc >= 0) & (loc < n_real) & keep
    rows = inside.nonzero()
    out.probs[rows[:, 0], loc[rows[:, 0], rows[:, 1]]] = (kept_e / z)[rows[:, 0], rows[:, 1]]
    for res in st.ew_results:
        ok = (res.tok >= 0)[:, None]
        out.probs[res.rows, :n_real] = torch.where(res.keep & ok, res.e / res.Z[:, None], 0.0)


def _finish(out, loc, rs, sampled_ok):
    """Greedy rows take the global argmax; returns (tok, logp, (probs, valid, nanrow))."""
    gvalid = loc.greedy & loc.valid & ~rs.nanrow & (rs.gmx > _NEG)
    tok = torch.where(gvalid, rs.gtok, out.tok)
    logp = torch.where(gvalid, 0.0, out.logp)
    valid = gvalid if sampled_ok is None else gvalid | sampled_ok
    if out.probs is not None:
        at = rs.gtok - loc.shard.start
        g = gvalid & (at >= 0) & (at < out.probs.shape[1])
        r = g.nonzero().squeeze(1)
        out.probs[r, at[r]] += 1.0
    return tok, logp, (out.probs, valid, rs.nanrow)


# ---------------------------------------------------------------- the call

def _pipeline(local_logits, table, rank, vocab_start, V, p, input_ids, prompt_lens, generator,
              seed, offset, draw_seeds, comm, want_draw):
    loc = _local_statistics(local_logits, table, rank, vocab_start, V, p, input_ids, prompt_lens)
    rs = _first_exchange(loc, V, draw_seeds, generator, seed, offset, comm)
    B, dev = local_logits.shape[0], local_logits.device
    out = _Outcome(torch.full((B,), -1, dtype=torch.int64, device=dev),
                   torch.full((B,), _NEG, device=dev),
                   None if want_draw else torch.zeros(B, local_logits.shape[1], device=dev))
    # all_greedy follows from the temperature, which _agree checked is equal on every rank:
    # every rank runs the candidate rounds, or none does.
    if loc.all_greedy:
        return _finish(out, loc, rs, None)
    st = _sampling_rows(loc, rs, V)
    K, win = _candidate_rounds(st, V, rs.seed, rs.offset, comm)
    if want_draw:
        _draw(st, win, K, V, rs.seed, rs.offset, out)
    else:
        _distribution(st, win, out)
    # Every sampling row keeps at least its max token, so it is valid.
    return _finish(out, loc, rs, st.sampling)


def _run(local_logits, vocab_start, vocab_size, group, values, input_ids, prompt_lens,
         generator, seed, offset, check, backend, want_draw, edit_args=(None, None),
         top=(None, "raw")):
    group = group if group is not None else dist.group.WORLD
    comm = _Comm(group, _comm_device(group, local_logits))
    rank = dist.get_rank(group)
    err, meta, draw_seeds = None, {}, False
    try:
        p, prompt_lens, seed, offset = _validate_local(
            local_logits, vocab_start, vocab_size, values, input_ids, prompt_lens,
            generator, seed, offset, check, backend)
        local_logits = _edited_shard(local_logits, vocab_start, vocab_size, edit_args, check)
        draw_seeds = want_draw and seed is None and params.needs_random(p.temperature)
        meta = _fingerprints(local_logits, vocab_start, vocab_size, p, input_ids, prompt_lens,
                             seed, offset, check, draw_seeds, want_draw)
        # top_logprobs decides which collectives follow the draw: validated and agreed here,
        # like every other argument, so that a bad or differing value raises on every rank
        n_top = params.check_top_n(*top)
        meta[_Meta.top_logprobs] = -1 if n_top is None else n_top
        meta[_Meta.logprobs_mode] = -1 if n_top is None else params.LOGPROBS_MODES.index(top[1])
        # the edits are global-vocabulary arguments each rank applies its part of: agreed too
        mask, bias = edit_args
        meta[_Meta.allowed_mask] = _fingerprint(mask)
        meta[_Meta.logit_bias] = 7 if bias is None else (
            (_fingerprint(bias[0]) * 3 + _fingerprint(bias[1])) & ((1 << 62) - 1))
    except ValueError as exc:
        err = exc
    table = _agree(comm, err, meta)
    _check_table(table)
    dev = local_logits.device
    # B is a column that _check_table found equal on every rank: all return here, or none.
    if local_logits.shape[0] == 0:
        return (torch.empty(0, dtype=torch.int64, device=dev), torch.empty(0, device=dev),
                None)
    return _pipeline(local_logits, table, rank, vocab_start, vocab_size, p, input_ids,
                     prompt_lens, generator, seed, offset, draw_seeds, comm, want_draw)


def _edited_shard(local_logits, vocab_start, vocab_size, edit_args, check):
    """The shard with the request's mask and bias applied (float32), as sample() edits the
    whole row; the shard itself when there are none."""
    B, width = local_logits.shape
    found = edits.shard_edits(*edit_args, B, vocab_size, vocab_start, width,
                              local_logits.device, check)
    return local_logits if found is None else edits.apply_edits(local_logits, found)


def _raw_logprobs(local_logits, vocab_start, vocab_size, comm):
    """This shard's log-softmax of the unedited logits over the whole vocabulary (padding
    columns -inf). Each rank's (max, sum) are gathered and combined in rank order, the same
    float operations on every rank (within a few ulps of torch.log_softmax on the whole row).
    """
    x = local_logits.to(_F32, copy=True)
    x[:, max(min(x.shape[1], vocab_size - vocab_start), 0):] = float("-inf")
    m = x.max(1).values
    s = torch.exp(x - _finite_or_zero(m)[:, None]).sum(1)
    g = _gather(torch.stack([m, s]), comm)                     # [W, 2, B]
    M = _finite_or_zero(g[:, 0].max(0).values)
    S = (g[:, 1] * torch.exp(g[:, 0] - M)).sum(0)
    # a row with no finite logit has S = 0: every place is (-1, -inf), as sample()'s raw top-N
    # (without this, -inf - log(0) is NaN and the NaN scores keep real-looking ids)
    return torch.where((S > 0)[:, None], (x - M[:, None]) - torch.log(S)[:, None], _NEG)


def _finite_or_zero(t):
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _merged_top_n(scores, vocab_start, vocab_size, n, comm, keys=None):
    """(global ids int64 [B, n], values float32 [B, n]) of the n best over all ranks, ordered by
    ``keys`` (default: the scores) desc then id asc (sample()'s order: it ranks raw top-N by
    the logit and processed top-N by the penalised logit, not by the rounded logprob, so
    distinct logits with equal logprobs keep their order); missing places are (-1, -inf)."""
    B, width = scores.shape
    real = max(min(width, vocab_size - vocab_start), 0)
    keys = scores if keys is None else keys
    ids, kv = rng.top_n(keys[:, :real], n)
    vals = kv if keys is scores or real == 0 else torch.where(
        ids >= 0, scores[:, :real].gather(1, ids.clamp_min(0)), float("-inf"))
    # padding places get an id past every real one, so they sort after real ties
    ids = torch.where(ids >= 0, ids + vocab_start, vocab_size)
    all_ids = _gather(ids, comm).permute(1, 0, 2).reshape(B, -1)
    all_keys = _gather(kv, comm).permute(1, 0, 2).reshape(B, -1)
    all_vals = _gather(vals, comm).permute(1, 0, 2).reshape(B, -1)
    all_ids, pos = all_ids.sort(dim=-1)  # rng.order_by_key, carrying the values along
    all_keys, all_vals = all_keys.gather(1, pos), all_vals.gather(1, pos)
    order = torch.sort(all_keys, dim=-1, descending=True, stable=True).indices[:, :n]
    ids, vals = all_ids.gather(1, order), all_vals.gather(1, order)
    return ids.masked_fill(ids >= vocab_size, -1), vals


def _top_keys(local_logits, vocab_start, vocab_size, mode, probs, dist_kw):
    """float32 [B, width]: what sample() ranks top-N by. Raw: the logits (fp32); processed: the
    penalised logits of the kept tokens (-inf elsewhere)."""
    x = local_logits.to(_F32)
    if mode == "raw":
        return x
    kw = dict(dist_kw)
    edit_args = (kw.pop("allowed_mask"), kw.pop("logit_bias"))
    input_ids, prompt_lens = kw.pop("input_ids"), kw.pop("prompt_lens")
    backend = kw.pop("backend")
    p, _, prompt_lens, _, _ = params.normalise(local_logits, kw, input_ids, prompt_lens,
                                               check=False, backend=backend,
                                               vocab_size=vocab_size)
    n_real = max(0, min(local_logits.shape[1], vocab_size - vocab_start))
    edited = _edited_shard(local_logits, vocab_start, vocab_size, edit_args, False)
    xp = _penalised_shard(edited, n_real, vocab_start, p, input_ids, prompt_lens)
    keys = torch.full_like(x, _NEG)
    keys[:, :n_real] = torch.where(probs[:, :n_real] > 0, xp, _NEG)
    return keys


def _raise_invalid(valid, nanrow, what):
    bad = ~valid
    if bool(bad.any()):
        params.raise_invalid_row(bad, lambda r: bool(nanrow[r]), what)


@torch.no_grad()
def sample(local_logits, *, vocab_start, vocab_size, group=None, temperature=1.0, top_k=0,
           top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
           frequency_penalty=0.0, input_ids=None, prompt_lens=None, generator=None, seed=None,
           offset=None, return_logprobs=False, check=True, backend="auto", allowed_mask=None,
           logit_bias=None, top_logprobs=None, logprobs_mode="raw"):
    """``gpu_sampler.sample`` on logits sharded by vocabulary across a process group.

    Collective: every rank of ``group`` must call it with the same arguments except
    ``local_logits`` and ``vocab_start``.

    Args:
        local_logits: [B, V_local] float32 / float16 / bfloat16, this rank's vocabulary slice;
            columns whose global id (vocab_start + column) is >= vocab_size are padding.
        vocab_start: global id of local column 0. The ranks' real columns must tile
            [0, vocab_size) (any rank order, uneven sizes allowed).
        vocab_size: global vocabulary size V.
        group: torch.distributed process group (default: WORLD). gloo moves CPU tensors, NCCL
            CUDA tensors on each rank's current device.
        input_ids: [B, L] history with *global* ids (negative = padding), the same on every rank.
        allowed_mask, logit_bias: as ``gpu_sampler.sample``, over the *global* vocabulary (mask
            int32 [B, ceil(V / 32)], bias ids global), the same on every rank; each rank
            applies its columns' part.
        generator: without ``seed``, rank 0 of the group draws one seed per row from its
            generator (or its default generator) and every rank uses those; the other ranks'
            generators advance by the same draw, so identically seeded generators stay in step.
        top_logprobs, logprobs_mode: as ``gpu_sampler.sample``; ids global. "raw" adds two
            small gathers (each rank's max, sum and non-finite flag, then its top N),
            "processed" runs the distribution pipeline once more (its logprobs are the log of
            that distribution: a kept token whose probability underflows reads -inf / -1).
        Everything else: as ``gpu_sampler.sample``. The torch twin's rules run on the merged
        candidates whatever ``backend`` says (it is validated and otherwise unused).

    Returns:
        LongTensor [B] (global ids), or (tokens, logprobs float32 [B]) with return_logprobs,
        or a ``SampleOutput`` with top_logprobs; identical on every rank.

    Example (one rank here; under ``torchrun --nproc-per-node 2`` each rank r would pass
    ``full[:, r * 500:(r + 1) * 500]`` with ``vocab_start=r * 500`` and get the same tokens):

        >>> import torch, torch.distributed as dist, gpu_sampler
        >>> from gpu_sampler import distributed as gsd
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> full = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
        >>> tok = gsd.sample(full, vocab_start=0, vocab_size=1000, top_k=50, seed=1)
        >>> torch.equal(tok, gpu_sampler.sample(full, top_k=50, seed=1, backend="torch"))
        True
        >>> dist.destroy_process_group()
    """
    vocab_start, vocab_size = _shard_int(vocab_start), _shard_int(vocab_size)
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    tok, logp, extra = _run(local_logits, vocab_start, vocab_size, group, values,
                            input_ids, prompt_lens, generator, seed, offset, check, backend, True,
                            (allowed_mask, logit_bias), (top_logprobs, logprobs_mode))
    n_top = params.check_top_n(top_logprobs, logprobs_mode)  # validated and agreed by _run
    if check and extra is not None:
        _raise_invalid(extra[1], extra[2], "sample")
    if n_top is None:
        return (tok, logp) if return_logprobs else tok
    if local_logits.shape[0] == 0:  # B was agreed in _run: every rank returns here
        return SampleOutput(tok, logp, *_no_top(n_top, tok.device))
    top = _top_logprobs(local_logits, vocab_start, vocab_size, group, n_top, logprobs_mode,
                        dict(values, input_ids=input_ids, prompt_lens=prompt_lens,
                             backend=backend, allowed_mask=allowed_mask, logit_bias=logit_bias))
    return SampleOutput(tok, logp, *top)


def _no_top(n, device):
    """sample()'s top-N of an empty batch: ids int64 [0, n], logprobs float32 [0, n]."""
    return (torch.full((0, n), -1, dtype=torch.int64, device=device),
            torch.full((0, n), _NEG, device=device))


def _top_logprobs(local_logits, vocab_start, vocab_size, group, n, mode, dist_kw):
    """(ids, logprobs) [B, n] of sample()'s top-N over the global vocabulary (its rules)."""
    group = group if group is not None else dist.group.WORLD
    comm = _Comm(group, _comm_device(group, local_logits))
    if mode == "raw":
        probs = None
        scores = _raw_logprobs(local_logits, vocab_start, vocab_size, comm)
    else:
        probs = sampling_distribution(local_logits, vocab_start=vocab_start,
                                      vocab_size=vocab_size, group=group, check=False,
                                      **dist_kw)
        scores = torch.log(probs)
    keys = _top_keys(local_logits, vocab_start, vocab_size, mode, probs, dist_kw)
    ids, vals = _merged_top_n(scores, vocab_start, vocab_size, n, comm,
                              keys=torch.where(scores > _NEG, keys, _NEG))
    ids = ids.masked_fill(vals == float("-inf"), -1)  # nothing past the kept / finite tokens
    if mode == "raw":  # a row with a NaN or +inf logit is (-1, NaN)
        bad = _gather(_nonfinite_rows(local_logits, vocab_start, vocab_size), comm).amax(0)
        return (ids.masked_fill(bad[:, None] > 0, -1),
                vals.masked_fill(bad[:, None] > 0, float("nan")))
    return ids, vals


def _nonfinite_rows(local_logits, vocab_start, vocab_size):
    """float32 [B]: 1 where this shard's real columns hold a NaN or +inf logit."""
    x = local_logits[:, :max(min(local_logits.shape[1], vocab_size - vocab_start), 0)]
    return (x.isnan() | (x == float("inf"))).any(1).to(_F32)


@torch.no_grad()
def sampling_distribution(local_logits, *, vocab_start, vocab_size, group=None, temperature=1.0,
                          top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                          presence_penalty=0.0, frequency_penalty=0.0, input_ids=None,
                          prompt_lens=None, check=True, backend="auto", allowed_mask=None,
                          logit_bias=None):
    """This rank's [B, V_local] float32 slice of ``gpu_sampler.sampling_distribution`` of the
    concatenated logits (padding columns are 0). Collective; arguments as ``sample``.

    Example (one rank; the 24 columns past ``vocab_size`` are padding):

        >>> import torch, torch.distributed as dist
        >>> from gpu_sampler import distributed as gsd
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> local = torch.randn(2, 1024, generator=torch.Generator().manual_seed(0))
        >>> p = gsd.sampling_distribution(local, vocab_start=0, vocab_size=1000, top_k=50)
        >>> p.shape, (p > 0).sum(1).tolist(), float(p[:, 1000:].abs().sum())
        (torch.Size([2, 1024]), [50, 50], 0.0)
        >>> dist.destroy_process_group()
    """
    vocab_start, vocab_size = _shard_int(vocab_start), _shard_int(vocab_size)
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    _, _, extra = _run(local_logits, vocab_start, vocab_size, group, values, input_ids,
                       prompt_lens, None, None, None, check, backend, False,
                       (allowed_mask, logit_bias))
    if extra is None:
        return torch.empty(local_logits.shape, dtype=_F32, device=local_logits.device)
    probs, valid, nanrow = extra
    if check:
        _raise_invalid(valid, nanrow, "sample from")
    return probs
