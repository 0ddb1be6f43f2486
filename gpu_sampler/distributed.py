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
"""
import math

import torch
import torch.distributed as dist

from . import params, reference, rng

_F32 = torch.float32
_NEG = float("-inf")
_EPS = torch.finfo(torch.float32).eps
_META = 22  # length of the per-rank argument fingerprint vector

# What this process sent, for bench/ and tests: bytes (payload x (world - 1), as a ring
# all_gather sends), collectives, escalation rounds and full-row gathers.
stats = dict(bytes_sent=0, collectives=0, escalations=0, full_rows=0)


# ---------------------------------------------------------------- collectives

def _comm_device(group, logits):
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather(t, group, cdev):
    """all_gather of one tensor: [W, *t.shape] on t's device."""
    W = dist.get_world_size(group)
    src = t.contiguous().to(cdev)
    out = [torch.empty_like(src) for _ in range(W)]
    dist.all_gather(out, src, group=group)
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
    # top_k >= V keeps all and history ids must be < V: both against the *global* vocabulary.
    p, _, prompt_lens, seed, offset = params.normalise(
        local_logits, values, input_ids, prompt_lens, generator, seed, offset, check, backend,
        vocab_size=vocab_size)
    return p, prompt_lens, seed, offset


def _agree(group, cdev, err, meta):
    """Collective 1: every rank learns every rank's fingerprints; any error raises everywhere.

    Returns the gathered [W, _META] int64 table (column 0 is the error flag)."""
    row = torch.zeros(_META, dtype=torch.int64)
    if err is None:
        row[1:1 + len(meta)] = torch.tensor(meta, dtype=torch.int64)
    else:
        row[0] = 1
    table = _gather(row, group, cdev)
    bad = table[:, 0].nonzero()
    if bad.numel():
        src = int(bad[0, 0])
        msg = [str(err) if err is not None else None]
        dist.broadcast_object_list(msg, src=dist.get_global_rank(group, src), group=group,
                                   device=cdev)
        raise ValueError(f"{msg[0]} (raised on rank {src} of the group)")
    return table


def _check_table(table, B):
    """Rank-symmetric checks on the gathered fingerprints (no collective: same data everywhere)."""
    names = ["B", "vocab_size", "input_ids width", "check", "seeds drawn", "temperature",
             "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "input_ids", "prompt_lens", "seed", "offset"]
    cols = [1, 2, 6, 7, 8] + list(range(9, 20))
    for name, c in zip(names, cols):
        if not bool((table[:, c] == table[0, c]).all()):
            ranks = (table[:, c] != table[0, c]).nonzero()[0, 0].item()
            raise ValueError(f"{name} differs between rank 0 and rank {ranks}: every rank must "
                             "pass the same arguments (only local_logits / vocab_start differ)")
    V = int(table[0, 2])
    starts, reals = table[:, 3].tolist(), table[:, 4].tolist()
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


# ---------------------------------------------------------------- the pipeline

class _Shard:
    """This rank's slice and the shard table."""

    def __init__(self, table, rank, vocab_start, x):
        self.starts = table[:, 3].tolist()
        self.reals = table[:, 4].tolist()
        self.rank = rank
        self.start = vocab_start
        self.x = x  # float32 [B, n_real], penalised
        self.width = max(max(self.reals), 1)


def _divide(v, tdiv):
    if isinstance(tdiv, torch.Tensor) or tdiv != 1.0:
        return v / tdiv
    return v


def _sub(v, rows):
    return v[rows] if isinstance(v, torch.Tensor) else v


def _gather_top(shard, rows, C, group, cdev, extra=None):
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
    allp = _gather(torch.cat(parts, 1), group, cdev)  # [W, R, 2C + E]
    W = allp.shape[0]
    av = _bits_f32(allp[:, :, :C]).permute(1, 0, 2).reshape(R, W * C)
    ai = allp[:, :, C:2 * C].permute(1, 0, 2).reshape(R, W * C)
    mv, j = torch.topk(av, C, dim=1)
    mi = ai.gather(1, j).to(torch.int64)
    return mv, mi, (allp[:, :, 2 * C:] if extra is not None else None)


def _elementwise_round(shard, rows, overflow, gmx, M, tdiv, cfg, seed, offset, group, cdev):
    """Rows kept by an elementwise rule: per rank, the kept count and mass and the Gumbel-max
    of its kept tokens; merged into (count, Z float64, token, logprob) per row."""
    x = shard.x[rows]
    R, n = x.shape
    dev = x.device
    of = overflow[rows][:, None]
    y = _divide(x, _sub(tdiv, rows))
    Mr = M[rows][:, None]
    e = torch.exp(y - Mr)
    keep = y > _NEG
    if cfg.mp_on:
        keep = keep & (e >= _sub(reference.col(cfg.min_p), rows))
    # Overflow rows keep their argmax tie group at value 0 (the T -> 0 limit, GUIDE rule).
    keep = torch.where(of, x == gmx[rows][:, None], keep)
    e = torch.where(of, 1.0, e)
    rel = torch.where(of, 0.0, y - Mr)
    gid = torch.arange(n, device=dev)[None, :] + shard.start
    stat = torch.zeros(R, 5, dtype=torch.float64, device=dev)
    stat[:, 3] = -1
    stat[:, 2] = _NEG
    if n > 0:
        if seed is None:  # sampling_distribution: no draw, any kept token marks the row
            score = torch.where(keep, 0.0, _NEG)
        else:
            g = rng.gumbel_rows(_sub(seed, rows), _sub(offset, rows),
                                gid.expand(R, n).contiguous())
            score = torch.where(keep, rel + g, _NEG)
        best = score.amax(1, keepdim=True)
        j = torch.where(score == best, gid, shard.start + n).argmin(1, keepdim=True)
        stat[:, 0] = keep.sum(1).double()
        stat[:, 1] = torch.where(keep, e, 0.0).double().sum(1)
        stat[:, 2] = best.squeeze(1).double()
        stat[:, 3] = (j.squeeze(1) + shard.start).double()
        stat[:, 4] = rel.gather(1, j).squeeze(1).double()
    allst = _gather(stat, group, cdev)  # [W, R, 5]
    count = allst[:, :, 0].sum(0)
    Z = allst[:, :, 1].sum(0)
    best = allst[:, :, 2].amax(0)
    ids = torch.where(allst[:, :, 2] == best, allst[:, :, 3], float("inf"))
    w = ids.argmin(0)
    tok = ids.gather(0, w[None]).squeeze(0).to(torch.int64)
    rel_tok = allst[:, :, 4].gather(0, w[None]).squeeze(0).to(_F32)
    Z32 = Z.to(_F32)
    lp = rel_tok - torch.log(Z32)
    ok = best > _NEG
    return count, Z32, torch.where(ok, tok, -1), lp, keep, e


def _z_interval(z_est, M, V):
    """fp32 bounds on the twin's full-row mass exp(logsumexp(x) - M), from an estimate.

    The twin rounds lse = M + log(Z) to fp32 (half an ulp of |lse|) after an fp32 cascade sum
    (a few eps, growing with log2 V); measured errors (V up to 151936, |M| up to 440, 2-4
    shards) stay under half of ulp(|lse|) + 4 eps (1 + log2(V) / 4). The bounds take twice that.
    """
    lse = (M.double() + torch.log(z_est)).abs().clamp_min(1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(lse)) - 23)
    t = 2 * (ulp + 4 * _EPS * (1 + 0.25 * math.log2(V)))
    lo = (z_est * torch.exp(-t) * (1 - _EPS)).to(_F32)
    hi = (z_est * torch.exp(t) * (1 + _EPS)).to(_F32)
    return lo, hi


def _full_rows(shard, rows, group, cdev):
    """The full penalised rows [R, V] (rare: top-p rows whose cut-off is within rounding)."""
    x = shard.x[rows]
    R = x.shape[0]
    buf = torch.full((R, shard.width), _NEG, device=x.device)
    buf[:, :x.shape[1]] = x
    allx = _gather(buf, group, cdev)
    V = sum(shard.reals)
    full = torch.empty((R, V), device=x.device)
    for s, n, part in zip(shard.starts, shard.reals, allx):
        if n > 0:
            full[:, s:s + n] = part[:, :n]
    return full


def _run(local_logits, vocab_start, vocab_size, group, values, input_ids, prompt_lens,
         generator, seed, offset, check, backend, want_draw):
    group = group if group is not None else dist.group.WORLD
    cdev = _comm_device(group, local_logits)
    rank = dist.get_rank(group)
    err, meta = None, []
    try:
        p, prompt_lens, seed, offset = _validate_local(
            local_logits, vocab_start, vocab_size, values, input_ids, prompt_lens,
            generator, seed, offset, check, backend)
        B, V_local = local_logits.shape
        n_real = max(0, min(V_local, vocab_size - vocab_start))
        draw_seeds = want_draw and seed is None and params.needs_random(p.temperature)
        meta = [B, vocab_size, vocab_start, n_real, V_local,
                -1 if input_ids is None else input_ids.shape[1], int(check), int(draw_seeds)]
        meta += [_fingerprint(getattr(p, n)) for n in params.SAMPLING_NAMES]
        meta += [_fingerprint(input_ids), _fingerprint(prompt_lens),
                 _fingerprint(seed if want_draw else None),
                 _fingerprint(offset if want_draw else None)]
    except ValueError as exc:
        err = exc
    table = _agree(group, cdev, err, meta)
    _check_table(table, B)
    dev = local_logits.device
    if B == 0:
        return (torch.empty(0, dtype=torch.int64, device=dev), torch.empty(0, device=dev),
                None)
    return _pipeline(local_logits, table, rank, vocab_start, vocab_size, p, input_ids,
                     prompt_lens, generator, seed, offset, draw_seeds, group, cdev, want_draw)


def _pipeline(local_logits, table, rank, vocab_start, V, p, input_ids, prompt_lens, generator,
              seed, offset, draw_seeds, group, cdev, want_draw):
    B = local_logits.shape[0]
    dev = local_logits.device
    n_real = int(table[rank, 4])
    T, k, top_p, min_p = p.temperature, p.top_k, p.top_p, p.min_p
    rp, pres, freq = p.repetition_penalty, p.presence_penalty, p.frequency_penalty

    # ---- local: fp32 copy of the real columns, penalties from the global history ids
    x = local_logits[:, :n_real].to(_F32)
    if input_ids is not None and input_ids.shape[1] > 0 and n_real > 0:
        has_rep, has_pf = p.has_repetition(), p.has_presence_frequency()
        if has_rep or has_pf:
            x = x.clone() if x.data_ptr() == local_logits.data_ptr() else x
            g = input_ids.to(torch.int64) - vocab_start
            local_ids = torch.where((g >= 0) & (g < n_real), g, -1)
            reference.apply_penalties(x, local_ids, prompt_lens if prompt_lens is not None else 0,
                                      rp, pres, freq, has_rep, has_pf)
    shard = _Shard(table, rank, vocab_start, x)

    # ---- the twin's row switches (reference's filter)
    no_penalty = input_ids is None or all(
        not isinstance(v, torch.Tensor) and v == off for v, off in ((rp, 1.0), (pres, 0.0),
                                                                    (freq, 0.0)))
    if want_draw and not isinstance(T, torch.Tensor) and T == 0 and no_penalty:
        bad = p.bad_rows()  # T is a number here: the twin's all-greedy fast path
    else:
        bad = p.bad_rows()
    valid = torch.ones(B, dtype=torch.bool, device=dev) if bad is None else ~bad
    if isinstance(T, torch.Tensor):
        greedy = T == 0
    else:
        greedy = torch.full((B,), T == 0, device=dev)
    all_greedy = bool(greedy.all())
    cfg = _Config(V, k, top_p, min_p)

    # ---- collective 2: row statistics (+ seeds) and the first candidates
    if n_real > 0:
        mx = x.amax(1)
        arg = x.argmax(1) + vocab_start
    else:
        mx = torch.full((B,), _NEG, device=dev)
        arg = torch.full((B,), vocab_start, dtype=torch.int64, device=dev)
    tdiv = (torch.where(~valid | greedy, 1.0, T)[:, None] if isinstance(T, torch.Tensor)
            else float(T) if not all_greedy else 1.0)
    zrows = cfg.z_full_rows(B, dev) & ~greedy if not all_greedy else None
    need_lse = zrows is not None and bool(zrows.any())
    m_loc = _divide(mx[:, None], tdiv)[:, 0]
    s_loc = torch.zeros(B, device=dev)
    if need_lse and n_real > 0:
        s_loc = torch.exp(_divide(x, tdiv) - m_loc[:, None]).sum(1)
    seeds_col = torch.zeros(B, 2, dtype=torch.int32, device=dev)
    if draw_seeds:
        seeds_col = params.draw_seeds(B, dev, generator, True).view(torch.int32).view(B, 2)
    row_stats = torch.cat([_f32_bits(mx)[:, None], arg.to(torch.int32)[:, None],
                       _f32_bits(s_loc)[:, None], seeds_col], 1)
    C = 0 if all_greedy else min(cfg.C0, V)
    if C > 0:
        cv, ci, st = _gather_top(shard, None, C, group, cdev, row_stats)
    else:
        st = _gather(row_stats, group, cdev)
    # st: [W, B, 5]
    mx_all = _bits_f32(st[:, :, 0])
    nanrow = mx_all.isnan().any(0)
    gmx = torch.where(mx_all.isnan(), _NEG, mx_all).amax(0)
    arg_all = st[:, :, 1].to(torch.int64)
    gtok = torch.where(mx_all == gmx, arg_all, V).amin(0)
    if draw_seeds:
        seed, offset = st[0, :, 3:5].contiguous().view(torch.int64).squeeze(1), 0

    tok = torch.full((B,), -1, dtype=torch.int64, device=dev)
    logp = torch.full((B,), _NEG, device=dev)
    gvalid = greedy & valid & ~nanrow & (gmx > _NEG)
    probs = None if want_draw else torch.zeros(B, local_logits.shape[1], device=dev)
    if all_greedy:
        return _finish(tok, logp, probs, gvalid, gtok, nanrow, vocab_start, local_logits)

    # ---- sampling rows
    M = _divide(gmx[:, None], tdiv)[:, 0]
    overflow = (M == float("inf")) & valid & ~greedy & ~nanrow
    M = torch.where(overflow, 0.0, M)
    sampling = (M > _NEG) & valid & ~greedy & ~nanrow
    tdiv_c = tdiv
    if bool(overflow.any()):
        tdiv_c = torch.where(overflow[:, None], 1.0, tdiv if isinstance(tdiv, torch.Tensor)
                             else torch.full((B, 1), tdiv, device=dev))
    kin = ~cfg.rows(cfg.kact, B, dev)
    elementwise = kin & ~cfg.rows(cfg.p_on, B, dev)
    in_b = overflow.clone()  # rows decided by the elementwise round
    cand = sampling & ~in_b
    # z_full estimate from the partial sums, and its rounding interval
    z_lo = z_hi = z_exact = None
    exact = torch.zeros(B, dtype=torch.bool, device=dev)
    if need_lse:
        m_all = _bits_f32(st[:, :, 0])
        m_all = _divide(m_all.T.contiguous(), tdiv)  # [B, W]
        s_all = _bits_f32(st[:, :, 2]).T
        ok = m_all > _NEG
        z_est = torch.where(ok, s_all.double() * torch.exp(m_all.double() - M.double()[:, None]),
                            0.0).sum(1)
        z_lo, z_hi = _z_interval(z_est, M, V)
        z_exact = torch.zeros(B, device=dev)
    have = torch.full((B,), C, dtype=torch.int64, device=dev)
    have = torch.where((cv[:, -1] == _NEG) | (C >= V), V, have)

    def apply_overflow(vals):
        # Overflow rows: argmax tie group at 0, the rest -inf (handled by the elementwise round).
        if bool(overflow.any()):
            vals = torch.where(overflow[:, None], torch.where(vals == gmx[:, None], 0.0, _NEG),
                               vals)
        return vals

    def width(K):
        Cw = cv.shape[1]
        if Cw >= K:
            v, i = cv[:, :K], ci[:, :K]
        else:
            v = torch.cat([cv, torch.full((B, K - Cw), _NEG, device=dev)], 1)
            i = torch.cat([ci, torch.zeros((B, K - Cw), dtype=torch.int64, device=dev)], 1)
        return _divide(apply_overflow(v), tdiv_c), i

    b_done = torch.zeros(B, dtype=torch.bool, device=dev)
    b_count = torch.zeros(B, dtype=torch.float64, device=dev)
    b_res = {}
    K = cfg.K0
    while True:
        while True:
            vk, ik = width(K)
            zf = torch.zeros(B, device=dev)  # unused by every row when no row needs it
            if z_lo is not None:
                zf = torch.where(exact, z_exact, z_lo)
            keep, e, tau_k, last = reference.filter_candidates(vk, cfg, lambda: zf)
            if z_lo is not None:
                keep2, _, _, last2 = reference.filter_candidates(
                    vk, cfg, lambda: torch.where(exact, z_exact, z_hi))
                amb = cand & zrows & ~exact & ((keep != keep2).any(1) | (last != last2))
                if bool(amb.any()):
                    r = amb.nonzero().squeeze(1)
                    full = _full_rows(shard, r, group, cdev)
                    stats["full_rows"] += r.numel()
                    rr = torch.cat([r, r[:1]]) if r.numel() == 1 else r
                    fr = torch.cat([full, full[:1]]) if r.numel() == 1 else full
                    lse = torch.logsumexp(_divide(fr, _sub(tdiv_c, rr)), 1)
                    z_exact[r] = torch.exp(lse - M[rr])[:r.numel()]
                    exact[r] = True
                    continue
            pos = (have.clamp_max(K) - 1)[:, None]
            dropped = ~keep.gather(1, pos).squeeze(1)
            if tau_k is not None:
                below = vk.gather(1, pos) < tau_k
                dropped &= below.squeeze(1) | kin
            suff = (have >= K) | dropped
            insuff = cand & ~suff
            to_b = insuff & elementwise
            if bool(to_b.any()):
                in_b |= to_b
                cand &= ~to_b
            esc = insuff & ~elementwise
            if bool(esc.any()):
                r = esc.nonzero().squeeze(1)
                C2 = min(V, 4 * max(int(have[r].max()), 1))
                mv, mi, _ = _gather_top(shard, r, C2, group, cdev)
                stats["escalations"] += 1
                if cv.shape[1] < C2:
                    pad = C2 - cv.shape[1]
                    cv = torch.cat([cv, torch.full((B, pad), _NEG, device=dev)], 1)
                    ci = torch.cat([ci, torch.zeros((B, pad), dtype=torch.int64, device=dev)], 1)
                cv[r, :C2], ci[r, :C2] = mv, mi
                cv[r, C2:] = _NEG
                have[r] = torch.where((mv[:, -1] == _NEG) | (C2 >= V), V, C2)
                continue
            break
        todo = in_b & sampling & ~b_done
        if bool(todo.any()):
            r = todo.nonzero().squeeze(1)
            cnt, Z, t, lp, bkeep, be = _elementwise_round(shard, r, overflow, gmx, M, tdiv_c, cfg,
                                                          seed, offset, group, cdev)
            b_count[r] = cnt
            b_done[r] = True
            b_res[len(b_res)] = (r, Z, t, lp, bkeep, be)
        # the twin's stop rule, at width K
        last_b = b_count < K
        if cfg.k_any:
            kk = cfg.top_k.double() if cfg.k_tensor else cfg.top_k
            short = overflow & ~kin & (b_count < kk)
            last_b &= ~short
        last_all = torch.where(in_b, last_b, last)
        if K == V or bool((last_all | ~sampling).all()):
            break
        K = min(V, K * 4)

    # ---- results of the candidate rows, at the twin's final width K
    keep = keep & (cand & sampling)[:, None]
    st_e = torch.where(keep, e, 0.0)
    ssum = st_e.sum(1)
    if want_draw:
        if bool(cand.any()):
            w = min(K, int(have[cand].max()))
            kw, vw, iw = keep[:, :w], vk[:, :w], ik[:, :w]
            g = rng.gumbel_rows(seed, offset, iw)
            score = torch.where(kw, (vw - M[:, None]) + g, _NEG)
            best = score.amax(1, keepdim=True)
            j = torch.where(score == best, iw, V).argmin(1, keepdim=True)
            t = iw.gather(1, j).squeeze(1)
            lp = (vw.gather(1, j).squeeze(1) - M) - torch.log(ssum)
            tok = torch.where(cand, t, tok)
            logp = torch.where(cand, lp, logp)
        for r, Z, t, lp, _, _ in b_res.values():
            tok[r], logp[r] = t, lp
    else:
        z = ssum.clamp_min(torch.finfo(_F32).tiny)[:, None]
        loc = ik - vocab_start
        inside = (loc >= 0) & (loc < n_real) & keep
        rows = inside.nonzero()
        probs[rows[:, 0], loc[rows[:, 0], rows[:, 1]]] = (st_e / z)[rows[:, 0], rows[:, 1]]
        for r, Z, t, lp, bkeep, be in b_res.values():
            ok = (t >= 0)[:, None]
            probs[r, :n_real] = torch.where(bkeep & ok, be / Z[:, None], 0.0)
    # Every sampling row keeps at least its max token, so it is valid.
    return _finish(tok, logp, probs, gvalid, gtok, nanrow, vocab_start, local_logits,
                   sampled_ok=sampling)


def _finish(tok, logp, probs, gvalid, gtok, nanrow, vocab_start, local_logits, sampled_ok=None):
    tok = torch.where(gvalid, gtok, tok)
    logp = torch.where(gvalid, 0.0, logp)
    valid = gvalid if sampled_ok is None else gvalid | sampled_ok
    if probs is not None:
        loc = gtok - vocab_start
        g = gvalid & (loc >= 0) & (loc < local_logits.shape[1])
        r = g.nonzero().squeeze(1)
        probs[r, loc[r]] += 1.0
    return tok, logp, (probs, valid, nanrow)


def _raise_invalid(valid, nanrow, what):
    bad = ~valid
    if bool(bad.any()):
        params.raise_invalid_row(bad, lambda r: bool(nanrow[r]), what)


@torch.no_grad()
def sample(local_logits, *, vocab_start, vocab_size, group=None, temperature=1.0, top_k=0,
           top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
           frequency_penalty=0.0, input_ids=None, prompt_lens=None, generator=None, seed=None,
           offset=None, return_logprobs=False, check=True, backend="auto"):
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
        generator: without ``seed``, rank 0 of the group draws one seed per row from its
            generator (or its default generator) and every rank uses those; the other ranks'
            generators advance by the same draw, so identically seeded generators stay in step.
        Everything else: as ``gpu_sampler.sample``. The torch twin's rules run on the merged
        candidates whatever ``backend`` says (it is validated and otherwise unused).

    Returns:
        LongTensor [B] (global ids), or (tokens, logprobs float32 [B]) with return_logprobs;
        identical on every rank.

    Example (run under ``torchrun --nproc-per-node 2``)::

        import torch, torch.distributed as dist
        from gpu_sampler import distributed as gsd
        dist.init_process_group("gloo")
        r, V = dist.get_rank(), 1000
        full = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
        shard = full[:, r * 500:(r + 1) * 500]
        tok = gsd.sample(shard, vocab_start=r * 500, vocab_size=V, top_k=50, seed=1)
    """
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    tok, logp, extra = _run(local_logits, vocab_start, vocab_size, group, values,
                            input_ids, prompt_lens, generator, seed, offset, check, backend, True)
    if check and extra is not None:
        _raise_invalid(extra[1], extra[2], "sample")
    return (tok, logp) if return_logprobs else tok


@torch.no_grad()
def sampling_distribution(local_logits, *, vocab_start, vocab_size, group=None, temperature=1.0,
                          top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                          presence_penalty=0.0, frequency_penalty=0.0, input_ids=None,
                          prompt_lens=None, check=True, backend="auto"):
    """This rank's [B, V_local] float32 slice of ``gpu_sampler.sampling_distribution`` of the
    concatenated logits (padding columns are 0). Collective; arguments as ``sample``."""
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    _, _, extra = _run(local_logits, vocab_start, vocab_size, group, values, input_ids,
                       prompt_lens, None, None, None, check, backend, False)
    if extra is None:
        return torch.empty(local_logits.shape, dtype=_F32, device=local_logits.device)
    probs, valid, nanrow = extra
    if check:
        _raise_invalid(valid, nanrow, "sample from")
    return probs
