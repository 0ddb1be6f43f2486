"""Torch twin of the fused kernel: the same rules, vectorised over rows, fast on CPU.

Semantics (shared with kernels/sampling.py; see kernels/README.md):
    xp = repetition penalty (HF rule, each distinct id once; ids < 0 are padding)
         then  xp -= presence * [c > 0] + frequency * c   (c = count at positions >= prompt_len)
    x  = xp / T ; T == 0 is greedy: argmax(xp), first index on ties
    kept = {x >= tau} with tau = max(tau_k, tau_p) and exp(x - M) >= min_p, where
        tau_k = k-th largest x (every token tied with it is kept; k >= #finite keeps all)
        tau_p = largest t whose mass {x >= t} (within the top-k set) is >= top_p * Z_k, i.e.
                keep i iff the mass of tokens strictly more probable than i is < top_p
    draw = argmax over kept of (x - M + Gumbel(seed, offset, token id))     (gpu_sampler/rng.py)
A row with NaN logits, no finite logit, or an invalid per-row parameter is *invalid*: token -1,
logprob -inf, distribution all zeros. A row whose x reaches +inf keeps only its +inf tokens.

No full-vocab sort: top-k uses torch.topk; top-p without top-k locates the cut-off bin of a
per-row histogram of x and sorts only that bin.
"""
import torch

from . import rng

_NB = 1024  # histogram bins for top-p without top-k


def _rows(v, B, dtype, device):
    if isinstance(v, torch.Tensor):
        return v.to(dtype=dtype, device=device)
    return torch.full((B,), v, dtype=dtype, device=device)


def _any(v, pred):
    if isinstance(v, torch.Tensor):
        return bool(pred(v).any())
    return bool(pred(torch.tensor(v)))


def _apply_penalties(x, ids, plen, rp, pres, freq, has_rep, has_pf):
    """In-place penalties on the fp32 copy x [B, V], touching only the [B, L] history ids."""
    B, V = x.shape
    L = ids.shape[1]
    valid = (ids >= 0) & (ids < V)
    any_valid = valid.any(1)
    # Padding slots borrow a valid id of their row, so every scatter target of a row receives the
    # same value (scatter with duplicate indices is only deterministic when the values agree).
    fill = torch.where(valid, ids, V).amin(1)
    fill = torch.where(any_valid, fill, 0)
    idx = torch.where(valid, ids, fill[:, None])
    vals = x.gather(1, idx)
    new = vals
    if has_rep:
        r = rp[:, None]
        new = torch.where(vals < 0, vals * r, vals / r)
    if has_pf:
        out = valid & (torch.arange(L, device=x.device)[None, :] >= plen[:, None])
        key = torch.arange(B, device=x.device)[:, None] * V + idx
        _, inv = torch.unique(key, return_inverse=True)
        cnt = torch.zeros(int(inv.max()) + 1, device=x.device).index_add_(
            0, inv.flatten(), out.flatten().to(torch.float32))
        c = cnt[inv]
        new = new - (torch.where(c > 0, pres[:, None], 0.0) + freq[:, None] * c)
    new = torch.where(any_valid[:, None], new, vals)
    x.scatter_(1, idx, new)


def _tie_aware_mass_above(vals, e):
    """For rows sorted descending: mass of strictly larger values before each entry."""
    K = vals.shape[1]
    excl = e.cumsum(1) - e
    pos = torch.arange(K, device=vals.device).expand_as(vals)
    is_start = torch.ones_like(vals, dtype=torch.bool)
    is_start[:, 1:] = vals[:, 1:] != vals[:, :-1]
    start = torch.where(is_start, pos, 0).cummax(1).values
    return excl.gather(1, start)


def _top_p_sorted(vals, e, above0, target, M):
    """tau_p from a sorted-descending candidate list (values, masses) plus the mass above it."""
    above = above0[:, None] + _tie_aware_mass_above(vals, e)
    keep = (above < target[:, None]) & (vals > float("-inf"))
    tau = torch.where(keep, vals, float("inf")).amin(1)
    # top_p == 0 keeps nothing by the rule; the max (and its ties) is always kept.
    return torch.where(torch.isinf(tau) & (tau > 0), M, tau)


def _top_p_histogram(x, e, M, target):
    """tau_p over whole rows without sorting them: bin x, find the bin where the mass from the
    top crosses the target, then resolve that bin exactly with a small topk."""
    B, V = x.shape
    pos = e > 0
    lo = torch.where(pos, x, float("inf")).amin(1)
    span = (M - lo).clamp_min(1e-30)
    b = ((M[:, None] - x) * (_NB / span)[:, None]).clamp_(0, _NB - 1).to(torch.int64)
    mass = torch.zeros(B, _NB, device=x.device).scatter_add_(1, b, e)
    cnt = torch.zeros(B, _NB, device=x.device).scatter_add_(1, b, pos.to(torch.float32))
    cum = mass.cumsum(1)
    bstar = (cum < target[:, None]).sum(1).clamp_(max=_NB - 1)
    above = (cum.gather(1, bstar[:, None]) - mass.gather(1, bstar[:, None])).squeeze(1)
    K = max(1, int(cnt.gather(1, bstar[:, None]).max()))
    sel = torch.where((b == bstar[:, None]) & pos, x, float("-inf"))
    vals = torch.topk(sel, min(K, V), dim=1).values
    ev = torch.where(vals > float("-inf"), torch.exp(vals - M[:, None]), 0.0)
    return _top_p_sorted(vals, ev, above, target, M)


def _filter(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
            frequency_penalty, input_ids, prompt_lens):
    """Shared front half: penalised/tempered x, per-row thresholds, and candidates if small."""
    B, V = logits.shape
    dev = logits.device
    f32 = torch.float32
    x = logits.to(f32, copy=True)
    T = _rows(temperature, B, f32, dev)
    rp = _rows(repetition_penalty, B, f32, dev)
    pres = _rows(presence_penalty, B, f32, dev)
    freq = _rows(frequency_penalty, B, f32, dev)
    k = _rows(top_k, B, torch.int64, dev)
    p = _rows(top_p, B, f32, dev)
    mp = _rows(min_p, B, f32, dev)
    bad = (T < 0) | T.isnan() | (rp <= 0) | rp.isnan() | pres.isnan() | freq.isnan() | (k < 0)
    bad |= (p < 0) | (p > 1) | p.isnan() | (mp < 0) | (mp > 1) | mp.isnan()

    if input_ids is not None and input_ids.shape[1] > 0:
        has_rep = _any(repetition_penalty, lambda v: v != 1.0)
        has_pf = _any(presence_penalty, lambda v: v != 0.0) or _any(frequency_penalty,
                                                                       lambda v: v != 0.0)
        if has_rep or has_pf:
            plen = _rows(prompt_lens if prompt_lens is not None else 0, B, torch.int64, dev)
            _apply_penalties(x, input_ids.to(torch.int64), plen, rp, pres, freq, has_rep, has_pf)

    greedy = T == 0
    greedy_tok = None
    if bool(greedy.any()):
        greedy_tok = x.argmax(1)
    tdiv = torch.where(greedy | bad, 1.0, T)
    if bool((tdiv != 1).any()):
        x.div_(tdiv[:, None])
    M = x.amax(1)
    nan_row = M.isnan()
    posinf = M == float("inf")
    if bool(posinf.any()):
        r = posinf.nonzero().squeeze(1)
        x[r] = torch.where(x[r] == float("inf"), 0.0, float("-inf"))
        M = torch.where(posinf, 0.0, M)
    if bool(nan_row.any()):
        # amax only propagates NaN when one is there; a NaN row is invalid as a whole.
        M = torch.where(nan_row, float("-inf"), M)
    valid = ~nan_row & (M > float("-inf")) & ~bad
    sampling = valid & ~greedy

    neg_inf = torch.full((B,), float("-inf"), device=dev)
    tau = neg_inf.clone()
    cand = None
    kact = sampling & (k > 0) & (k < V)
    if bool(kact.any()):
        K = int(k[kact].max())
        vals, idx = torch.topk(x, min(K + 1, V), dim=1)
        tau_k = vals.gather(1, (torch.where(kact, k, 1) - 1)[:, None]).squeeze(1)
        tau_k = torch.where(kact, tau_k, float("-inf"))
        spill = kact & (vals[:, -1] >= tau_k) & (tau_k > float("-inf")) & (vals.shape[1] < V)
        if bool(spill.any()):
            # Ties with the k-th value run past the candidates: take all of them.
            n = (x[spill] >= tau_k[spill, None]).sum(1)
            vals, idx = torch.topk(x, int(n.max()), dim=1)
        tau = tau_k
        if bool((kact | ~sampling).all()):
            cand = (vals, idx)

    pact = sampling & (p < 1)
    if bool(pact.any()):
        if cand is not None:
            vals, idx = cand
            e = torch.where(vals >= tau[:, None], torch.exp(vals - M[:, None]), 0.0)
            tau_p = _top_p_sorted(vals, e, torch.zeros(B, device=dev), p * e.sum(1), M)
        else:
            e = torch.where(x >= tau[:, None], torch.exp(x - M[:, None]), 0.0)
            tau_p = _top_p_histogram(x, e, M, p * e.sum(1))
        tau = torch.maximum(tau, torch.where(pact, tau_p, float("-inf")))
    mp = torch.where(sampling, mp, 0.0)
    return x, M, tau, mp, cand, greedy, greedy_tok, valid, sampling


def _keep(vals, M, tau, mp):
    e = torch.exp(vals - M[:, None])
    keep = (vals >= tau[:, None]) & (e >= mp[:, None]) & (vals > float("-inf"))
    return keep, torch.where(keep, e, 0.0)


def sample_reference(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                     repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                     input_ids=None, prompt_lens=None, seed=0, offset=0):
    """Torch twin of ``kernels.fused_sample``: (tokens int64 [B], logprobs float32 [B])."""
    B, V = logits.shape
    dev = logits.device
    x, M, tau, mp, cand, greedy, greedy_tok, valid, sampling = _filter(
        logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty, input_ids, prompt_lens)
    tok = torch.full((B,), -1, dtype=torch.int64, device=dev)
    logp = torch.full((B,), float("-inf"), device=dev)
    if bool(sampling.any()):
        if cand is not None:
            vals, ids = cand
        else:
            vals, ids = x, torch.arange(V, device=dev).expand(B, V)
        keep, e = _keep(vals, M, tau, mp)
        z = e.sum(1)
        k_lo, k_hi = rng.row_keys(_rows(seed, B, torch.int64, dev), _rows(offset, B, torch.int64, dev))
        score = torch.where(keep, (vals - M[:, None]) + rng.gumbel(k_lo, k_hi, ids), float("-inf"))
        if cand is None:
            j = score.argmax(1)  # first max = lowest token id on an exact tie, like the kernel
        else:
            # candidates are in value order: break exact score ties by token id as the kernel does
            best = score.amax(1, keepdim=True)
            j = torch.where(score == best, ids, V).argmin(1)
        t = ids.gather(1, j[:, None]).squeeze(1)
        lp = (vals.gather(1, j[:, None]).squeeze(1) - M) - torch.log(z)
        tok = torch.where(sampling, t, tok)
        logp = torch.where(sampling, lp, logp)
    if greedy_tok is not None:
        g = greedy & valid
        tok = torch.where(g, greedy_tok, tok)
        logp = torch.where(g, 0.0, logp)
    return tok, logp


def sampling_distribution_reference(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                    repetition_penalty=1.0, presence_penalty=0.0,
                                    frequency_penalty=0.0, input_ids=None, prompt_lens=None):
    """Torch twin of the distribution ``fused_sample(write_probs=True)`` writes: float32 [B, V]."""
    B, V = logits.shape
    x, M, tau, mp, cand, greedy, greedy_tok, valid, sampling = _filter(
        logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty, input_ids, prompt_lens)
    _, e = _keep(x, M, tau, mp)
    e = torch.where(sampling[:, None], e, 0.0)
    probs = e / e.sum(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    if greedy_tok is not None:
        g = greedy & valid
        onehot = torch.zeros_like(probs).scatter_(1, greedy_tok[:, None], 1.0)
        probs = torch.where(g[:, None], onehot, probs)
    return probs


def processed_logits_reference(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                               repetition_penalty=1.0, presence_penalty=0.0,
                               frequency_penalty=0.0, input_ids=None, prompt_lens=None):
    """float32 [B, V] processed scores, as transformers' ``output_scores`` reports them:
    xp / T on the kept tokens and -inf elsewhere; greedy rows (T == 0) get the penalised xp
    with nothing filtered (HF applies no warpers when it does not sample)."""
    x, M, tau, mp, cand, greedy, greedy_tok, valid, sampling = _filter(
        logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty, input_ids, prompt_lens)
    keep, _ = _keep(x, M, tau, mp)
    out = torch.where(keep, x, float("-inf"))
    return torch.where((greedy | ~valid)[:, None], x, out)
