"""Speculative decoding's verification step: ``speculative_sample()`` (Triton and torch).

Row b holds K draft tokens d_0 .. d_{K-1} and the target model's logits at K + 1 positions.
At position i, p_i is the distribution ``sampling_distribution()`` gives for target row i with
the call's parameters, the penalties seeing the history ``input_ids`` extended by
d_0 .. d_{i-1}; q_i is the draft's distribution (``draft_probs``, or the one-hot of d_i when the
draft has no probabilities: prompt lookup, n-grams). Then, for i = 0, 1, ...:

    accept d_i  with probability  min(1, p_i(d_i) / q_i(d_i))
    at the first rejection emit a token drawn from normalise(max(0, p_i - q_i)) and stop;
    if all K are accepted, emit a bonus token drawn from p_K.

The emitted tokens are distributed exactly as K + 1 tokens sampled from the target one at a
time (Leviathan et al. 2023; Chen et al. 2023). A temperature-0 row has a one-hot p_i, so it
accepts while d_i is the argmax (lowest id on ties) and emits the argmax at the first mismatch.

Randomness is counter-based (gpu_sampler/rng.py), per row and position: position i uses the
row's (seed, offset + i), and the B (K + 1) target rows are one sampling batch.

- One-hot q: position i's token is the one ``sample()`` gives there (Gumbel-max with that
  stream); d_i is accepted iff it equals that token. That is the rule: the draw equals d_i with
  probability p_i(d_i), and a draw that is not d_i is distributed as p_i given not d_i, which
  is normalise(max(0, p_i - onehot(d_i))). So prompt lookup emits exactly the tokens plain
  sampling would, and the verification is one sampling launch over the B (K + 1) rows.
- Draft distributions q: u_i < p_i(d_i) / q_i(d_i) with u_i the uniform of the reserved id
  2**32 - 1 (no vocabulary reaches it, so u_i is independent of every token's noise); a
  residual draw is Gumbel-max over the residual with position i's per-token noise, lowest id
  on ties; the bonus token is Gumbel-max over p_K with position K's noise: ``sample()``'s
  token there, unless two scores tie within rounding (log p_K(v) is x_v - M - log Z rounded
  once more than the kernel's x_v - M).

Both backends give the same tokens for the same streams: the Triton backend runs the fused
sampler (kernels/sampling.py) over the B (K + 1) rows, the torch backend its twin. With draft
distributions the Triton backend computes p_i(d_i) and every position's residual draw inside
those launches (kernels/residual.py): one read of a target row whose kept set the candidates
decide (bounded top-k; most top-p / min-p rows), q gathered at kept tokens only.
"""
from typing import NamedTuple, Optional, Tuple

import torch

from . import params, rng, sampler

__all__ = ["speculative_sample", "SpeculativeOutput"]

ACCEPT_STREAM = (1 << 32) - 1  # rng id of the acceptance uniforms
_PROB_TOL = 1e-3  # |sum(q) - 1| allowed for draft_probs rows (float32 softmax output)


class SpeculativeOutput(NamedTuple):
    """``speculative_sample(..., return_logprobs=True)``'s result.

    Example:
        >>> import torch, gpu_sampler
        >>> out = gpu_sampler.speculative_sample(torch.zeros(1, 3, 5), torch.tensor([[1, 2]]),
        ...                                      seed=0, return_logprobs=True)
        >>> out.tokens.shape, out.num_accepted.shape, out.logprobs.shape
        (torch.Size([1, 3]), torch.Size([1]), torch.Size([1, 3]))
    """
    tokens: torch.Tensor        # int64 [B, K + 1]: emitted tokens, then -1
    num_accepted: torch.Tensor  # int64 [B]
    logprobs: torch.Tensor      # float32 [B, K + 1]: log p_i(token), -inf past the emitted


def _check_shapes(target_logits, draft_tokens, draft_probs):
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 3:
        raise ValueError(f"target_logits must be a 3-D tensor [B, K + 1, V], got "
                         f"{getattr(target_logits, 'shape', type(target_logits).__name__)}")
    B, K1, V = target_logits.shape
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2 \
            or draft_tokens.dtype.is_floating_point or draft_tokens.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor [B, K], got "
                         f"{getattr(draft_tokens, 'shape', type(draft_tokens).__name__)}")
    if draft_tokens.shape[1] == 0:
        raise ValueError("draft_tokens has K=0 columns: verify at least one draft token "
                         "(with none, call sample())")
    if tuple(draft_tokens.shape) != (B, K1 - 1):
        raise ValueError(f"draft_tokens must be [B, K] = [{B}, {K1 - 1}] for target_logits "
                         f"{tuple(target_logits.shape)}, got {tuple(draft_tokens.shape)}")
    if draft_tokens.device != target_logits.device:
        raise ValueError(f"draft_tokens must be on the logits' device {target_logits.device}")
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) \
                or tuple(draft_probs.shape) != (B, K1 - 1, V) \
                or not draft_probs.dtype.is_floating_point:
            raise ValueError(f"draft_probs must be a float tensor [B, K, V] = "
                             f"[{B}, {K1 - 1}, {V}], got "
                             f"{getattr(draft_probs, 'shape', type(draft_probs).__name__)}")
        if draft_probs.device != target_logits.device:
            raise ValueError(f"draft_probs must be on the logits' device {target_logits.device}")


def _bad_draft_rows(draft_tokens, draft_probs, V):
    """bool [B]: rows whose draft tokens are outside [0, V) or whose draft_probs are NaN,
    negative or not normalised."""
    bad = ((draft_tokens < 0) | (draft_tokens >= V)).any(1)
    if draft_probs is not None:
        q = draft_probs.to(torch.float32)
        # A NaN makes the sum NaN, which fails the tolerance test: two passes over q, not four.
        bad |= ((q.amin(2) < 0) | ~((q.sum(2) - 1).abs() <= _PROB_TOL)).any(1)
    return bad


def _raise_bad_draft(draft_tokens, draft_probs, V, bad):
    b = int(bad.nonzero()[0, 0])
    t = draft_tokens[b]
    if bool(((t < 0) | (t >= V)).any()):
        raise ValueError(f"draft_tokens row {b} holds {t.tolist()}: ids must be in [0, V={V})")
    raise ValueError(f"draft_probs row {b} is not a distribution (NaN, negative, or rows that "
                     f"do not sum to 1)")


def _extended_history(input_ids, draft_tokens):
    """int64 [B * (K + 1), L + K]: row (b, i) is input_ids[b] then d_0 .. d_{i-1}, then -1."""
    B, K = draft_tokens.shape
    dev = draft_tokens.device
    hist = (torch.empty(B, 0, dtype=torch.int64, device=dev) if input_ids is None
            else input_ids.to(torch.int64))
    drafts = draft_tokens.to(torch.int64)[:, None, :].expand(B, K + 1, K)
    before = torch.arange(K, device=dev)[None, :] < torch.arange(K + 1, device=dev)[:, None]
    drafts = torch.where(before, drafts, -1)
    rows = torch.cat([hist[:, None, :].expand(B, K + 1, hist.shape[1]), drafts], 2)
    return rows.reshape(B * (K + 1), -1)


class _Rows(NamedTuple):
    """The B * (K + 1) target rows as one sampling batch: row b * (K + 1) + i is position i of
    row b, with its parameters, extended history and stream (seed, offset + i)."""
    logits: torch.Tensor              # [B * (K + 1), V]
    p: params.SamplingParams          # numbers, or [B * (K + 1)] tensors
    history: Optional[torch.Tensor]   # int64 [B * (K + 1), L + K] (-1 padded) or None
    prompt_lens: Optional[torch.Tensor]
    seed: torch.Tensor                # int64 [B * (K + 1)]
    offset: torch.Tensor              # int64 [B * (K + 1)]


def _per_position(v, K1):
    """A (B,) parameter repeated for the K + 1 positions of each row (numbers stay numbers)."""
    return v.repeat_interleave(K1) if isinstance(v, torch.Tensor) else v


def _flat_rows(target_logits, draft_tokens, p, input_ids, prompt_lens, seed, offset):
    """The call as one sampling batch of B (K + 1) rows (``_Rows``): the history is built only
    where a penalty or ``input_ids`` needs it."""
    B, K1, V = target_logits.shape
    dev = target_logits.device
    flat = params.SamplingParams(**{k: _per_position(v, K1) for k, v in p.as_kwargs().items()})
    has_history = input_ids is not None or p.has_repetition() or p.has_presence_frequency()
    hist = _extended_history(input_ids, draft_tokens) if has_history else None
    plen = _per_position(prompt_lens, K1) if isinstance(prompt_lens, torch.Tensor) \
        else prompt_lens
    seeds = params.per_row(seed, B, torch.int64, dev).repeat_interleave(K1)
    offs = (params.per_row(offset, B, torch.int64, dev)[:, None]
            + torch.arange(K1, device=dev)).flatten()
    return _Rows(target_logits.reshape(B * K1, V), flat, hist, plen, seeds, offs)


def _sample_rows(rows, backend):
    """sample()'s (tokens int64 [R], logprobs float32 [R]) for ``rows`` (invalid rows: -1 /
    -inf): the kernel or its twin, the same tokens for the same streams."""
    return sampler.sample(rows.logits, input_ids=rows.history, prompt_lens=rows.prompt_lens,
                          seed=rows.seed, offset=rows.offset, return_logprobs=True,
                          check=False, backend=backend, **rows.p.as_kwargs())


def _distribution_rows(rows, backend):
    """sampling_distribution() of ``rows``: float32 [R, V], zero rows where invalid."""
    return sampler.sampling_distribution(rows.logits, input_ids=rows.history,
                                         prompt_lens=rows.prompt_lens, check=False,
                                         backend=backend, **rows.p.as_kwargs())


def _at_drafts(probs, draft_tokens):
    """float32 [B, K]: probs[b, i, d_i] for probs [B, >= K, V]."""
    K = draft_tokens.shape[1]
    d = draft_tokens.to(torch.int64)[:, :, None]
    return probs[:, :K].gather(2, d).squeeze(2).to(torch.float32)


def _accepted(p_d, q_d, seed, offset):
    """Leading accepted drafts per row (int64 [B]) by the rule min(1, p/q), from p and q at the
    drafts ([B, K]), u_i from the acceptance stream of (seed, offset + i)."""
    B, K = p_d.shape
    k_lo, k_hi = rng.row_keys(seed.view(B, K + 1)[:, :K].flatten(),
                              offset.view(B, K + 1)[:, :K].flatten())
    u = rng.uniform(k_lo, k_hi, torch.full_like(k_lo, ACCEPT_STREAM)).view(B, K)
    accept = u * q_d < p_d  # u < p / q without dividing (q = 0 accepts when p > 0)
    return accept.to(torch.int64).cumprod(1).sum(1)


def _noise_on_support(device):
    """The residual vanishes off p's support: on the CPU draw noise for that support only (its
    width is a host sync, free there); on a GPU the whole row, with no sync. Same tokens."""
    return device.type == "cpu"


def _residual_draw(P, Q, n, seed, offset):
    """Tokens [B]: Gumbel-max over normalise(max(0, p_n - q_n)) with position n's per-token
    noise, lowest id on ties; over p_K where n = K (the bonus token). Reads p and q at one
    position per row."""
    B, K1, V = P.shape
    rows = torch.arange(B, device=P.device)
    p_n = P[rows, n]
    q_n = torch.where((n < K1 - 1)[:, None], Q[rows, n.clamp(max=K1 - 2)], 0.0)
    if _noise_on_support(P.device):
        p_n, ids = torch.topk(p_n, max(1, int((p_n > 0).sum(1).max())), dim=1)
        q_n = q_n.gather(1, ids)
    else:
        ids = torch.arange(V, device=P.device).expand(B, V)
    r = (p_n - q_n).clamp_min(0)
    # Rounding can leave no residual mass where p and q agree: then p itself is the residual.
    r = torch.where((r.sum(1) > 0)[:, None], r, p_n)
    off = offset.view(B, K1).gather(1, n[:, None]).squeeze(1)
    score = torch.where(r > 0, torch.log(r) + rng.gumbel_rows(seed.view(B, K1)[:, 0], off, ids),
                        float("-inf"))
    return rng.first_best(score, ids, V)[0]


def _emitted(candidates, n, valid):
    """bool [B, K + 1]: the positions a row emits (its accepted drafts and one more)."""
    pos = torch.arange(candidates.shape[1], device=n.device)[None, :]
    return valid[:, None] & (pos <= n[:, None])


def _draw_verify(rows, draft_tokens, bad_draft, backend, check, target_logits):
    """One-hot q (drafts without probabilities): every position is sampled as sample() would
    with its stream; d_i is accepted iff that draw is d_i. P(accept) = p_i(d_i), and a rejected
    position emits its draw, distributed as p_i given not d_i = normalise(max(0, p_i - q_i)):
    the rule, with the tokens plain sampling gives. One sampling launch over the B (K + 1)
    rows: each target row read once, no host sync (check=False)."""
    B, K = draft_tokens.shape
    tok, logp = _sample_rows(rows, backend)
    tok, logp = tok.view(B, K + 1), logp.view(B, K + 1)
    valid = ~bad_draft & (tok >= 0).all(1)
    if check and not bool(valid.all()):
        _raise_invalid_position(target_logits, tok < 0)
    n = torch.where(valid, (tok[:, :K] == draft_tokens).to(torch.int64).cumprod(1).sum(1), 0)
    keep = _emitted(tok, n, valid)
    out = SpeculativeOutput(torch.where(keep, tok, -1), n,
                            torch.where(keep, logp, float("-inf")))
    return out


def _probs_verify(rows, draft_tokens, Q, bad_draft, backend, check, target_logits):
    """Draft distributions q: p_i for every position (the fused distribution launches), the
    acceptance test at the drafts, then one Gumbel-max draw per row at its first rejection
    (over the residual) or at position K (over p_K): no host sync on a GPU."""
    B, K = draft_tokens.shape
    P = _distribution_rows(rows, backend).view(B, K + 1, -1)
    valid = ~bad_draft & (P.sum(2) > 0).all(1)
    if check and not bool(valid.all()):
        _raise_invalid_position(target_logits, ~(P.sum(2) > 0))
    n = torch.where(valid, _accepted(_at_drafts(P, draft_tokens), _at_drafts(Q, draft_tokens),
                                     rows.seed, rows.offset), 0)
    last = _residual_draw(P, Q, n, rows.seed, rows.offset)
    tokens = torch.cat([draft_tokens.to(torch.int64), last[:, None]], 1)
    tokens[torch.arange(B, device=P.device), n] = last
    keep = _emitted(tokens, n, valid)
    tokens = torch.where(keep, tokens, -1)
    lp = torch.log(P.gather(2, tokens.clamp_min(0)[:, :, None]).squeeze(2))
    return SpeculativeOutput(tokens, n, torch.where(keep, lp, float("-inf")))


def _fused_probs_verify(rows, draft_tokens, draft_probs, bad_draft, check, target_logits):
    """Draft distributions on the Triton backend: the fused launches give, per position, p_i(d_i)
    and the token drawn as if position i were the first rejection (over p_K at i = K), with its
    log p, from one read of each target row decided on its candidates (kernels/residual.py:
    two for the others) and q gathered at kept tokens; then the acceptance test picks the
    position. No [B, K + 1, V] distribution in memory, no host sync (check=False)."""
    from . import kernels
    B, K = draft_tokens.shape
    out = kernels.fused_sample(rows.logits, input_ids=rows.history, prompt_lens=rows.prompt_lens,
                               seed=rows.seed, offset=rows.offset,
                               residual=(draft_probs, draft_tokens), **rows.p.as_kwargs())
    tok, logp, p_d = (t.view(B, K + 1) for t in out)
    valid = ~bad_draft & (tok >= 0).all(1)
    if check and not bool(valid.all()):
        _raise_invalid_position(target_logits, tok < 0)
    n = torch.where(valid, _accepted(p_d[:, :K], _at_drafts(draft_probs, draft_tokens),
                                     rows.seed, rows.offset), 0)
    rows_b = torch.arange(B, device=tok.device)
    tokens = torch.cat([draft_tokens, tok[:, K:]], 1)
    tokens[rows_b, n] = tok[rows_b, n]
    lp = torch.cat([torch.log(p_d[:, :K]), logp[:, K:]], 1)
    lp[rows_b, n] = logp[rows_b, n]
    keep = _emitted(tokens, n, valid)
    return SpeculativeOutput(torch.where(keep, tokens, -1), n,
                             torch.where(keep, lp, float("-inf")))


def _greedy_verify(target_logits, draft_tokens, p, bad_draft, check):
    """Every row greedy (temperature a number 0) and no penalty: p_i is one-hot at the argmax
    (lowest id on ties), so only the argmaxes are needed. Returns a SpeculativeOutput, or None
    for the general path (other parameters; an invalid row with check=True, whose error the
    general path raises)."""
    if isinstance(p.temperature, torch.Tensor) or p.temperature != 0 or p.has_repetition() \
            or p.has_presence_frequency():
        return None
    K = draft_tokens.shape[1]
    best = target_logits.argmax(2)
    top = target_logits.gather(2, best[:, :, None]).squeeze(2)
    valid = ~bad_draft & (~top.isnan() & (top > float("-inf"))).all(1)
    bad = p.bad_rows()
    if bad is not None:
        valid &= ~bad
    if check and not bool(valid.all()):
        return None
    n = torch.where(valid, (draft_tokens == best[:, :K]).to(torch.int64).cumprod(1).sum(1), 0)
    keep = _emitted(best, n, valid)
    tokens = torch.where(keep, best, -1)
    logprobs = torch.where(keep, 0.0, float("-inf"))
    return SpeculativeOutput(tokens, n, logprobs)


def _raise_invalid_position(target_logits, bad):
    """ValueError for the first (row, position) of ``bad`` (bool [B, K + 1])."""
    r = int(bad.any(1).nonzero()[0, 0])
    i = int(bad[r].nonzero()[0, 0])
    if bool(target_logits[r, i].isnan().any()):
        raise ValueError(f"target_logits row {r}, position {i} contains NaN")
    raise ValueError(f"target_logits row {r}, position {i} has no finite logit left to sample "
                     "(all -inf after penalties, or an invalid per-row parameter)")


@torch.no_grad()
def speculative_sample(target_logits, draft_tokens, draft_probs=None, *, temperature=1.0,
                       top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                       presence_penalty=0.0, frequency_penalty=0.0, input_ids=None,
                       prompt_lens=None, seed=None, offset=None, generator=None,
                       return_logprobs=False, check=True, backend="auto"):
    """Verify K draft tokens per row against the target's logits (module docstring).

    Args:
        target_logits: [B, K + 1, V] float32 / float16 / bfloat16, the target model's logits at
            the K draft positions and one more.
        draft_tokens: integer [B, K], K >= 1, ids in [0, V).
        draft_probs: float [B, K, V], the draft's sampling distribution at each position, or
            None for drafts without probabilities (q = one-hot of the draft token).
        temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty, input_ids, prompt_lens, generator: as ``sample()``; one value per
            row (a number or a [B] tensor), applied at every position; the penalties see
            ``input_ids`` extended by the accepted drafts.
        seed, offset: as ``sample()``; position i uses (seed, offset + i).
        return_logprobs: also return float32 [B, K + 1] log p_i of each emitted token.
        check: raise ValueError for invalid rows (NaN logits, nothing left to sample, bad
            draft tokens or probabilities); with check=False such rows emit -1 everywhere
            and num_accepted 0.
        backend: "auto" (the Triton kernel on CUDA, the torch twin otherwise), "triton" or
            "torch"; the same tokens on both.

    Returns:
        (tokens int64 [B, K + 1], num_accepted int64 [B]), plus logprobs with return_logprobs.
        ``tokens[b, :num_accepted[b] + 1]`` are the emitted tokens, the rest -1.

    Example:
        >>> import torch, gpu_sampler
        >>> target = torch.randn(2, 4, 100)
        >>> drafts = torch.randint(0, 100, (2, 3))
        >>> tok, n = gpu_sampler.speculative_sample(target, drafts, top_k=20, seed=7)
        >>> tok.shape, n.shape
        (torch.Size([2, 4]), torch.Size([2]))
    """
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    if torch.compiler.is_compiling():
        return _traced(target_logits, draft_tokens, draft_probs, values, input_ids, prompt_lens,
                       seed, offset, generator, return_logprobs, backend)
    _check_shapes(target_logits, draft_tokens, draft_probs)
    B, K1, V = target_logits.shape
    params.check_logits(target_logits[:, 0], backend, name="target_logits")  # its own name
    p, input_ids, prompt_lens, seed, offset = params.normalise(
        target_logits[:, 0], values, input_ids, prompt_lens, generator, seed, offset, check,
        backend)
    if seed is None:
        seed, offset = params.draw_seeds(B, target_logits.device, generator, True), 0
    bad_draft = _bad_draft_rows(draft_tokens, draft_probs, V)
    if check and bool(bad_draft.any()):
        _raise_bad_draft(draft_tokens, draft_probs, V, bad_draft)
    safe_drafts = torch.where(bad_draft[:, None], 0, draft_tokens.to(torch.int64))
    out = _greedy_verify(target_logits, safe_drafts, p, bad_draft, check)
    if out is None:
        rows = _flat_rows(target_logits, safe_drafts, p, input_ids, prompt_lens, seed, offset)
        which = params.pick_backend(backend, target_logits)
        if draft_probs is None:
            out = _draw_verify(rows, safe_drafts, bad_draft, which, check, target_logits)
        elif which == "triton":
            out = _fused_probs_verify(rows, safe_drafts, draft_probs, bad_draft, check,
                                      target_logits)
        else:
            Q = torch.where(bad_draft[:, None, None], 0.0, draft_probs.to(torch.float32))
            out = _probs_verify(rows, safe_drafts, Q, bad_draft, which, check, target_logits)
    return out if return_logprobs else (out.tokens, out.num_accepted)


# ---- the torch op: what torch.compile traces ----------------------------------------------

@torch.library.custom_op("gpu_sampler::speculative_sample", mutates_args=())
def _speculative_op(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                    draft_probs: Optional[torch.Tensor], temperature: torch.Tensor,
                    top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                    repetition_penalty: torch.Tensor, presence_penalty: torch.Tensor,
                    frequency_penalty: torch.Tensor, input_ids: Optional[torch.Tensor],
                    prompt_lens: Optional[torch.Tensor], seed: torch.Tensor,
                    offset: torch.Tensor, backend: str
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.ops.gpu_sampler.speculative_sample``: ``speculative_sample(check=False,
    return_logprobs=True)`` with every parameter a [B] tensor, as one opaque op."""
    out = speculative_sample(target_logits, draft_tokens, draft_probs, temperature=temperature,
                             top_k=top_k, top_p=top_p, min_p=min_p,
                             repetition_penalty=repetition_penalty,
                             presence_penalty=presence_penalty,
                             frequency_penalty=frequency_penalty, input_ids=input_ids,
                             prompt_lens=prompt_lens, seed=seed, offset=offset,
                             return_logprobs=True, check=False, backend=backend)
    return out.tokens, out.num_accepted, out.logprobs


@_speculative_op.register_fake
def _(target_logits, draft_tokens, draft_probs, temperature, top_k, top_p, min_p,
      repetition_penalty, presence_penalty, frequency_penalty, input_ids, prompt_lens, seed,
      offset, backend):
    B, K1 = target_logits.shape[:2]
    return (target_logits.new_empty((B, K1), dtype=torch.int64),
            target_logits.new_empty((B,), dtype=torch.int64),
            target_logits.new_empty((B, K1), dtype=torch.float32))


def _traced(target_logits, draft_tokens, draft_probs, values, input_ids, prompt_lens, seed,
            offset, generator, return_logprobs, backend):
    """``speculative_sample()`` inside torch.compile: the op, parameters as [B] tensors;
    validation runs in the op's eager body (check=False semantics: invalid rows give -1)."""
    if generator is not None:
        raise NotImplementedError("speculative_sample() under torch.compile does not take a "
                                  "generator: pass seed (and offset) tensors")
    rows, prompt_lens, seed, offset = params.op_params(
        values, prompt_lens, seed, offset, target_logits.shape[0], target_logits.device)
    tokens, n, logprobs = torch.ops.gpu_sampler.speculative_sample(
        target_logits, draft_tokens, draft_probs, input_ids=input_ids, prompt_lens=prompt_lens,
        seed=seed, offset=offset, backend=backend, **rows)
    out = SpeculativeOutput(tokens, n, logprobs)
    return out if return_logprobs else (out.tokens, out.num_accepted)
