"""Torch twin of the fused kernel: the same rules, vectorised over rows, fast on CPU.

Semantics (shared with kernels/sampling.py; see kernels/README.md):
    xp = repetition penalty (HF rule, each distinct id once; ids < 0 are padding)
         then  xp -= presence * [c > 0] + frequency * c   (c = count at positions >= prompt_len)
    x  = xp / T ; T == 0 is greedy: argmax(xp), first index on ties
    kept = {x >= tau} with tau = max(tau_k, tau_p) and x - M >= ln min_p, where
        tau_k = k-th largest x (every token tied with it is kept; k >= #finite keeps all)
        tau_p = largest t whose mass {x >= t} (within the top-k set) is >= top_p * Z_k, i.e.
                keep i iff the mass of tokens strictly more probable than i is < top_p
        ln min_p = float32 log (params.log_cut), compared with the float32 x - M: the same
                kept set on every backend (e^(x - M) >= min_p would follow each exp's rounding)
    draw = argmax over kept of (x - M + Gumbel(seed, offset, token id))     (gpu_sampler/rng.py)
A row with NaN logits, no finite logit, or an invalid per-row parameter is *invalid*: token -1,
logprob -inf, distribution all zeros (per-row rules: docs/reliability.md). A row whose max x
overflows (to +inf, or to -inf while its max xp is finite) is the limit T -> 0: it keeps the
tokens whose xp equals its max xp, uniformly. The max tie group always survives top-p.

No full-vocab sort on the usual paths: everything after the penalties runs on the top-K
candidates of torch.topk, with K grown only when a row keeps more than K tokens.

This module is the CPU backend of ``sample()`` (``twin_sample``, ``twin_distribution``,
``twin_processed`` take a ``params.SamplingParams``), the source of generate()'s
``output_scores`` and, through its public pieces (``Switches``, ``filter_candidates``,
``apply_penalties``, ``col``), the local step of the vocab-parallel sampler. The
``*_reference`` functions are the same with keyword parameters, as tests call them.
"""
import math

import torch

from . import params, rng
from .params import SamplingParams

K0 = 256  # first candidate count when no top-k bounds the kept set


def col(v):
    """A parameter as something that broadcasts against [B, K]: a Python number or [B, 1]."""
    return v[:, None] if isinstance(v, torch.Tensor) else v


def apply_penalties(x, ids, plen, rp, pres, freq, has_rep, has_pf):
    """In-place penalties on the fp32 copy x [B, V], touching only the [B, L] history ids.
    Ids < 0 are padding; so are ids >= V (only check=False lets them through), as the kernel's
    history pre-step (kernels/history.py) and the vocab-parallel shards treat them."""
    B, V = x.shape
    L = ids.shape[1]
    if bool(ids.min() >= 0) and bool(ids.max() < V):
        idx, valid, any_valid = ids, None, None
    else:
        valid = (ids >= 0) & (ids < V)
        any_valid = valid.any(1)
        # Padding slots borrow a valid id of their row, so every scatter target of a row gets
        # the same value (scatter with duplicate indices is only deterministic when they agree).
        fill = torch.where(any_valid, torch.where(valid, ids, V).amin(1), 0)
        idx = torch.where(valid, ids, fill[:, None])
    vals = x.gather(1, idx)
    new = vals
    if has_rep:
        r = col(rp)
        new = torch.where(vals < 0, vals * r, vals / r)
    if has_pf:
        out = (torch.arange(L, device=x.device)[None, :] >= col(plen)).expand(B, L)
        if valid is not None:
            out = out & valid
        key = torch.arange(B, device=x.device)[:, None] * V + idx
        _, inv = torch.unique(key, return_inverse=True)
        cnt = torch.zeros(int(inv.max()) + 1, device=x.device).index_add_(
            0, inv.flatten(), out.flatten().to(torch.float32))
        c = cnt[inv]
        new = new - (torch.where(c > 0, col(pres), 0.0) + col(freq) * c)
    if any_valid is not None:
        new = torch.where(any_valid[:, None], new, vals)
    x.scatter_(1, idx, new)


def _tie_aware_mass_above(vals, e):
    """For rows sorted descending: mass of strictly larger values before each entry."""
    K = vals.shape[1]
    excl = e.cumsum(1) - e
    if K == 1 or not bool((vals[:, 1:] == vals[:, :-1]).any()):
        return excl
    pos = torch.arange(K, device=vals.device).expand_as(vals)
    is_start = torch.ones_like(vals, dtype=torch.bool)
    is_start[:, 1:] = vals[:, 1:] != vals[:, :-1]
    start = torch.where(is_start, pos, 0).cummax(1).values
    return excl.gather(1, start)


def _overflow_rows(x, idx, M, valid, greedy):
    """Rows to sample whose max x = xp / T is +-inf although their max xp is not -inf (x
    overflowed, or xp holds +inf): their indices, or None. NaN and dead rows are not among them."""
    top = x.gather(1, idx[:, :1]).squeeze(1)  # max xp (topk runs on xp)
    ovf = M.isinf() & (top > float("-inf"))
    if valid is not None:
        ovf = ovf & valid
    if greedy is not None:
        ovf = ovf & ~greedy
    if not bool(ovf.any()):
        return None
    return ovf.nonzero().squeeze(1)


class Switches:
    """Which filters a call has on, from the normalised parameters (shared with distributed)."""
    __slots__ = ("V", "top_k", "top_p", "min_p", "k_tensor", "kact", "k_any", "K0", "p_on",
                 "p_any", "p_zero", "mp_on", "log_min_p")

    def __init__(self, V, top_k, top_p, min_p):
        self.V, self.top_k, self.top_p, self.min_p = V, top_k, top_p, min_p
        k = top_k
        self.k_tensor = isinstance(k, torch.Tensor)
        self.kact = ((k > 0) & (k < V)) if self.k_tensor else (0 < k < V)
        self.k_any = bool(self.kact.any()) if self.k_tensor else self.kact
        # First candidate count: max(top_k) + 1 (the K-th candidate must be provably dropped).
        self.K0 = (min(V, (int(k.max()) if self.k_tensor else k) + 1) if self.k_any
                   else min(V, K0))
        self.p_on = col(top_p) < 1.0
        self.p_any = bool(self.p_on.any()) if isinstance(self.p_on, torch.Tensor) else self.p_on
        # The max tie group is always kept: its mass above is exactly 0, which is < top_p * z
        # (z >= 1) for any top_p > 0 in float32; only a top_p that is 0 in float32 needs the
        # explicit fallback (a per-row tensor may hold one).
        self.p_zero = isinstance(top_p, torch.Tensor) or top_p <= 2.0 ** -150  # 0 in float32
        self.mp_on = isinstance(min_p, torch.Tensor) or min_p > 0
        self.log_min_p = params.log_cut(min_p)  # min-p keeps x - M >= it


def window_mass(e, keepdim=False):
    """sum(e, 1) over a candidate window whose bits do not depend on its width K: a float64
    left fold (cumsum) rounded once, so the zero columns a wider window adds (another row's
    larger top_k, or K grown for another row) change nothing; e.sum(1)'s vectorised order did,
    making a row's Z, logprob and distribution depend on the rest of the batch."""
    z = e.to(torch.float64).cumsum(1)[:, -1].to(e.dtype)
    return z[:, None] if keepdim else z


class _Lazy:
    """A value computed on first use (the full-row mass is only needed without top-k)."""
    __slots__ = ("fn", "value")

    def __init__(self, fn):
        self.fn, self.value = fn, None

    def __call__(self):
        if self.value is None:
            self.value = self.fn()
        return self.value


def filter_candidates(vals, sw, z_full):
    """The kept set on one window of sorted candidates: the rules after the temperature.

    vals: float32 [B, K], each row descending (-inf padded), already divided by T; sw: the
    call's Switches; z_full(): float32 [B] full-row mass sum(exp(x - M)), called only where
    no top-k is active. Returns (keep [B, K] bool, e [B, K] masked exp(x - M), tau_k [B, 1] or
    None, last_dropped [B] bool: the window's last candidate is provably not kept, so no
    token beyond the window can be). The twin calls it on torch.topk windows, the
    vocab-parallel sampler on candidates merged across ranks.
    """
    M = vals[:, 0]
    # Invalid rows may get NaN here; they are masked by `sampling` by the caller.
    e = torch.exp(vals - M[:, None])
    k = sw.top_k
    if sw.k_any and sw.k_tensor:
        kk = torch.where(sw.kact, k, 1) - 1
        tau_k = torch.where(sw.kact, vals.gather(1, kk[:, None]).squeeze(1),
                            float("-inf"))[:, None]
        keep = vals >= tau_k
    elif sw.k_any:
        tau_k = vals[:, k - 1:k]
        keep = vals >= tau_k
    else:
        tau_k = None
        keep = vals > float("-inf")
    keep = keep & (vals > float("-inf"))
    e = e * keep
    if sw.k_any:
        z = window_mass(e)
        if sw.k_tensor and not bool(sw.kact.all()):
            z = torch.where(sw.kact, z, z_full())
    else:
        z = z_full()
    if sw.p_any:
        above = _tie_aware_mass_above(vals, e)
        kp = keep & (above < col(sw.top_p) * z[:, None])
        if sw.p_zero:
            kp = kp | (keep & (above == 0))
        keep = torch.where(sw.p_on, kp, keep) if isinstance(sw.p_on, torch.Tensor) else kp
    if sw.mp_on:
        keep = keep & ((vals - M[:, None]) >= col(sw.log_min_p))
    last_dropped = ~keep[:, -1]
    if tau_k is not None:
        # A -inf last candidate: every token beyond it is -inf too (no mass, never kept).
        below_k = ~(vals[:, -1:] >= tau_k).squeeze(1) | (vals[:, -1] == float("-inf"))
        last_dropped &= (below_k | ~sw.kact) if sw.k_tensor else below_k
    return keep, e, tau_k, last_dropped


class _State:
    """Per-row outcome of the filters, on the top-K candidates (sorted by value)."""
    __slots__ = ("x", "vals", "idx", "keep", "e", "M", "greedy", "greedy_tok", "valid",
                 "sampling")


def _penalised(logits, p, input_ids, prompt_lens):
    """(fp32 logits after the penalties, whether the tensor is a copy this call owns)."""
    x = logits.to(torch.float32)
    owned = x is not logits  # in-place edits need a copy of the caller's tensor
    if input_ids is None or input_ids.shape[1] == 0:
        return x, owned
    has_rep, has_pf = p.has_repetition(), p.has_presence_frequency()
    if has_rep or has_pf:
        if not owned:
            x, owned = x.clone(), True
        plen = prompt_lens if prompt_lens is not None else 0
        apply_penalties(x, input_ids.to(torch.int64), plen, p.repetition_penalty,
                        p.presence_penalty, p.frequency_penalty, has_rep, has_pf)
    return x, owned


def _greedy_rows(st, p, B, dev):
    """Greedy rows (T == 0) take the argmax; returns True when every row is greedy."""
    T = p.temperature
    if isinstance(T, torch.Tensor):
        greedy = T == 0
        any_greedy, all_greedy = bool(greedy.any()), bool(greedy.all())
    else:
        greedy = torch.full((B,), T == 0, device=dev) if T == 0 else None
        any_greedy = all_greedy = T == 0
    st.greedy_tok = None
    bad = p.bad_rows()
    # valid / greedy stay None on the common path (scalar T > 0, scalar parameters).
    valid = None if bad is None else ~bad
    if greedy is not None and valid is None:
        valid = torch.ones(B, dtype=torch.bool, device=dev)
    if any_greedy:
        st.greedy_tok = st.x.argmax(1)
        top = st.x.gather(1, st.greedy_tok[:, None]).squeeze(1)  # NaN wins argmax, like torch
        gvalid = ~top.isnan() & (top > float("-inf"))
        valid = torch.where(greedy, valid & gvalid, valid)
    st.greedy, st.valid = greedy, valid
    return all_greedy


def _limit_overflow(st, idx, M, tdiv, owned):
    """Rows whose x = xp / T overflowed take the limit T -> 0 (the argmax tie group of xp):
    (new tdiv, owned) after rewriting them, or None when no row overflowed."""
    r = _overflow_rows(st.x, idx, M, st.valid, st.greedy)
    if r is None:
        return None
    B = st.x.shape[0]
    if not owned:
        st.x = st.x.clone()
    if not isinstance(tdiv, torch.Tensor):
        tdiv = torch.full((B, 1), tdiv, device=st.x.device)
    xr = st.x[r]
    st.x[r] = torch.where(xr == xr.gather(1, idx[r, :1]), 0.0, float("-inf"))
    tdiv[r] = 1.0
    return tdiv, True


def _filter(logits, p, input_ids, prompt_lens):
    """Penalties, temperature, then the kept set as a mask over the top-K candidates.

    K starts at max(top_k) + 1 (or 256) and grows x4 until, on every sampling row, the K-th
    candidate is dropped by the rules: kept sets are upper sets ({x >= tau}), so nothing
    beyond the candidates can be kept. Typical top-k / top-p rows never need more than one
    topk; a row that keeps most of the vocabulary ends with K = V (a full sort).
    """
    B, V = logits.shape
    st = _State()
    st.x, owned = _penalised(logits, p, input_ids, prompt_lens)
    if _greedy_rows(st, p, B, logits.device):
        st.sampling = torch.zeros(B, dtype=torch.bool, device=logits.device)
        return st
    T, valid, greedy = p.temperature, st.valid, st.greedy
    # Positive scaling keeps each row's order, so topk runs on xp and only the candidates are
    # divided; a tie the division creates at the k-th value keeps the last candidate, and K grows.
    # Scalars stay Python numbers: at small B the cost is the number of torch calls.
    tdiv = torch.where(~valid | greedy, 1.0, T)[:, None] if isinstance(T, torch.Tensor) else float(T)
    sw = Switches(V, p.top_k, p.top_p, p.min_p)
    K, z_full = sw.K0, None
    while True:
        vals, idx = torch.topk(st.x, K, dim=1)
        if isinstance(tdiv, torch.Tensor) or tdiv != 1.0:
            vals = vals / tdiv
        M = vals[:, 0]
        # One reduction flags any non-finite M (a sum that merely overflows only costs the
        # exact per-row test): overflowed rows, and also NaN / dead rows.
        if not math.isfinite(M.sum().item()):
            redo = _limit_overflow(st, idx, M, tdiv, owned)
            if redo is not None:
                tdiv, owned = redo
                continue
        sampling = M > float("-inf")  # False for NaN rows too
        if valid is not None:
            sampling = sampling & valid
        if greedy is not None:
            sampling = sampling & ~greedy
        if z_full is None:
            x = st.x
            # the sum itself, not e^(logsumexp - M): that rounds log Z at ulp(M), a relative
            # error of 2^-11 in Z at |M| ~ 2^12 (T <~ 0.01)
            z_full = _Lazy(lambda: torch.exp(x / tdiv - torch.where(sampling, M, 0.0)[:, None])
                           .sum(1))
        keep, e, tau_k, last_dropped = filter_candidates(vals, sw, z_full)
        if K == V or bool((last_dropped | ~sampling).all()):
            break
        K = min(V, K * 4)
    st.vals, st.idx, st.M = vals, idx, M
    st.keep = keep & sampling[:, None]
    st.e = torch.where(st.keep, e, 0.0)
    st.sampling = sampling
    if valid is None:
        st.valid = sampling
    else:
        st.valid = valid & (sampling if greedy is None else greedy | sampling)
    return st


def _all_greedy_argmax(logits, p):
    """All-greedy without penalties (generate()'s greedy step): no fp32 copy, four ops."""
    tok = logits.argmax(1)
    top = logits.gather(1, tok[:, None]).squeeze(1)
    ok = ~top.isnan() & (top > float("-inf"))
    bad = p.bad_rows()
    if bad is not None:
        ok &= ~bad
    return torch.where(ok, tok, -1), torch.where(ok, 0.0, float("-inf"))


@torch.no_grad()
def twin_sample(logits, p, input_ids=None, prompt_lens=None, seed=0, offset=0):
    """Torch twin of ``kernels.fused_sample``: (tokens int64 [B], logprobs float32 [B]) for
    normalised ``p`` (a ``SamplingParams``)."""
    B, V = logits.shape
    dev = logits.device
    no_penalty = input_ids is None or not (p.has_repetition() or p.has_presence_frequency())
    if not isinstance(p.temperature, torch.Tensor) and p.temperature == 0 and no_penalty:
        return _all_greedy_argmax(logits, p)
    st = _filter(logits, p, input_ids, prompt_lens)
    tok = torch.full((B,), -1, dtype=torch.int64, device=dev)
    logp = torch.full((B,), float("-inf"), device=dev)
    if st.greedy is None or bool(st.sampling.any()):
        g = rng.gumbel_rows(seed, offset, st.idx)
        score = torch.where(st.keep, (st.vals - st.M[:, None]) + g, float("-inf"))
        t, j = rng.first_best(score, st.idx, V)
        lp = (st.vals.gather(1, j).squeeze(1) - st.M) - torch.log(window_mass(st.e))
        tok = torch.where(st.sampling, t, tok)
        logp = torch.where(st.sampling, lp, logp)
    if st.greedy_tok is not None:
        g = st.greedy & st.valid
        tok = torch.where(g, st.greedy_tok, tok)
        logp = torch.where(g, 0.0, logp)
    return tok, logp


@torch.no_grad()
def twin_distribution(logits, p, input_ids=None, prompt_lens=None):
    """Torch twin of the distribution ``fused_sample(write_probs=True)`` writes: float32 [B, V]."""
    B, V = logits.shape
    st = _filter(logits, p, input_ids, prompt_lens)
    probs = torch.zeros(B, V, device=logits.device)
    if bool(st.sampling.any()):
        z = window_mass(st.e, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        probs.scatter_(1, st.idx, st.e / z)
    if st.greedy_tok is not None:
        g = (st.greedy & st.valid).to(torch.float32)[:, None]
        probs.scatter_add_(1, st.greedy_tok[:, None], g)
    return probs


@torch.no_grad()
def twin_processed(logits, p, input_ids=None, prompt_lens=None):
    """float32 [B, V] processed scores, as transformers' ``output_scores`` reports them:
    xp / T on the kept tokens and -inf elsewhere; greedy rows (T == 0) get the penalised xp
    with nothing filtered (HF applies no warpers when it does not sample)."""
    B, V = logits.shape
    st = _filter(logits, p, input_ids, prompt_lens)
    if not bool(st.sampling.any()):
        return st.x
    out = torch.full((B, V), float("-inf"), device=logits.device)
    out.scatter_(1, st.idx, torch.where(st.keep, st.vals, float("-inf")))
    return torch.where(st.sampling[:, None], out, st.x)


@torch.no_grad()
def twin_top_n_raw(logits, n):
    """Top-N of the raw logits (kernels/topn.py's rule): (ids int64 [B, n], logprobs float32
    [B, n]) ordered by the logit (fp32) descending, lowest id first among equal logits;
    logprob = l - logsumexp(l); places past the finite logits are (-1, -inf); every place of a
    row holding a NaN or +inf logit is (-1, NaN)."""
    x = logits.to(torch.float32)
    ids, vals = rng.top_n(x, n)
    fin = torch.isfinite(x)
    M = torch.where(fin, x, float("-inf")).amax(1, keepdim=True)
    M = torch.where(M > float("-inf"), M, 0.0)
    Z = torch.where(fin, torch.exp(x - M), 0.0).sum(1, keepdim=True)
    gone = vals == float("-inf")
    lp = torch.where(gone, float("-inf"), (vals - M) - torch.log(Z))
    bad = (x.isnan() | (x == float("inf"))).any(1, keepdim=True)
    return torch.where(bad | gone, -1, ids), torch.where(bad, float("nan"), lp)


@torch.no_grad()
def twin_top_n_processed(logits, p, n, input_ids=None, prompt_lens=None):
    """Top-N of the distribution ``twin_sample`` draws from (kernels/topn.py's rule): the kept
    tokens ordered by the penalised logit xp descending, lowest id first among equal xp, with
    logprob (x - M) - log Z_f (the drawn token's own arithmetic); a greedy row's argmax first
    with 0.0; the other places, and every place of an invalid row, (-1, -inf)."""
    B = logits.shape[0]
    st = _filter(logits, p, input_ids, prompt_lens)
    ids = torch.full((B, n), -1, dtype=torch.int64, device=logits.device)
    lp = torch.full((B, n), float("-inf"), device=logits.device)
    if bool(st.sampling.any()):
        xp = torch.where(st.keep, st.x.gather(1, st.idx), float("-inf"))
        # the candidates' columns in the output order: xp descending, then id ascending
        _, pos = st.idx.sort(dim=1)
        perm = pos.gather(1, torch.sort(xp.gather(1, pos), dim=1, descending=True,
                                        stable=True).indices)
        k = min(n, perm.shape[1])
        perm = perm[:, :k]
        kept = xp.gather(1, perm) > float("-inf")
        kl = (st.vals.gather(1, perm) - st.M[:, None]) - torch.log(window_mass(st.e, keepdim=True))
        ids[:, :k] = torch.where(kept, st.idx.gather(1, perm), -1)
        lp[:, :k] = torch.where(kept, kl, float("-inf"))
    if st.greedy_tok is not None and n:
        g = st.greedy & st.valid
        ids[:, 0] = torch.where(g, st.greedy_tok, ids[:, 0])
        lp[:, 0] = torch.where(g, 0.0, lp[:, 0])
    return ids, lp


def sample_reference(logits, *, input_ids=None, prompt_lens=None, seed=0, offset=0, **values):
    """``twin_sample`` with the seven parameters as keywords (already normalised values)."""
    return twin_sample(logits, SamplingParams(**values), input_ids, prompt_lens, seed, offset)


def sampling_distribution_reference(logits, *, input_ids=None, prompt_lens=None, **values):
    """``twin_distribution`` with the seven parameters as keywords (normalised values)."""
    return twin_distribution(logits, SamplingParams(**values), input_ids, prompt_lens)


def processed_logits_reference(logits, *, input_ids=None, prompt_lens=None, **values):
    """``twin_processed`` with the seven parameters as keywords (normalised values)."""
    return twin_processed(logits, SamplingParams(**values), input_ids, prompt_lens)
