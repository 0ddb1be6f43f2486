"""Speculative decoding's verification step: ``speculative_sample()`` (torch backend).

Row b holds K draft tokens d_0 .. d_{K-1} and the target model's logits at K + 1 positions.
At position i, p_i is the distribution ``sampling_distribution()`` gives for target row i with
the call's parameters, the penalties seeing the history ``input_ids`` extended by
d_0 .. d_{i-1}; q_i is the draft's distribution (``draft_probs``, or the one-hot of d_i when the
draft has no probabilities: prompt lookup, n-grams). Then, for i = 0, 1, ...:

    accept d_i  iff  u_i < p_i(d_i) / q_i(d_i)       (u_i uniform in (0, 1): probability
                                                      min(1, p_i(d_i) / q_i(d_i)))
    at the first rejection emit a token drawn from normalise(max(0, p_i - q_i)) and stop;
    if all K are accepted, emit a bonus token drawn from p_K.

The emitted tokens are distributed exactly as K + 1 tokens sampled from the target one at a
time (Leviathan et al. 2023; Chen et al. 2023). A temperature-0 row has a one-hot p_i, so it
accepts while d_i is the argmax (lowest id on ties) and emits the argmax at the first mismatch.

Randomness is counter-based (gpu_sampler/rng.py), per row and position: u_i and the draw at
position i use the row's (seed, offset + i). The bonus token is the token ``sample()`` gives
for row K with (seed, offset + K), bit for bit; a residual draw is Gumbel-max over the residual with the
same per-token noise, lowest id on ties. ``u_i`` is the uniform of the reserved id 2**32 - 1
(no vocabulary reaches it), so it is independent of every token's noise.
"""
from typing import NamedTuple, Optional, Tuple

import torch

from . import params, reference, rng

__all__ = ["speculative_sample", "SpeculativeOutput"]

ACCEPT_STREAM = (1 << 32) - 1  # rng id of the acceptance uniforms
_PROB_TOL = 1e-3  # |sum(q) - 1| allowed for draft_probs rows (float32 softmax output)


class SpeculativeOutput(NamedTuple):
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


def _per_position(v, K1):
    """A (B,) parameter repeated for the K + 1 positions of each row (numbers stay numbers)."""
    return v.repeat_interleave(K1) if isinstance(v, torch.Tensor) else v


def _target_probs(target_logits, draft_tokens, p, input_ids, prompt_lens):
    """p_i for every row and position: float32 [B, K + 1, V] (zero rows where invalid)."""
    B, K1, V = target_logits.shape
    flat = params.SamplingParams(**{k: _per_position(v, K1) for k, v in p.as_kwargs().items()})
    has_history = input_ids is not None or p.has_repetition() or p.has_presence_frequency()
    hist = _extended_history(input_ids, draft_tokens) if has_history else None
    plen = _per_position(prompt_lens, K1) if prompt_lens is not None else None
    probs = reference.twin_distribution(target_logits.reshape(B * K1, V), flat, hist, plen)
    return probs.view(B, K1, V)


def _accepted(P, Q, draft_tokens, seed, offset):
    """Leading accepted drafts per row (int64 [B]) by the rule min(1, p/q)."""
    B, K = draft_tokens.shape
    d = draft_tokens.to(torch.int64)[:, :, None]
    p_d = P[:, :K].gather(2, d).squeeze(2)
    q_d = torch.ones_like(p_d) if Q is None else Q.to(torch.float32).gather(2, d).squeeze(2)
    pos = torch.arange(K, device=d.device)
    seeds = seed if isinstance(seed, torch.Tensor) else torch.full((B,), seed, device=d.device)
    offs = offset if isinstance(offset, torch.Tensor) else torch.full((B,), offset,
                                                                       device=d.device)
    k_lo, k_hi = rng.row_keys(seeds.to(torch.int64).repeat_interleave(K),
                              (offs.to(torch.int64)[:, None] + pos).flatten())
    u = rng.uniform(k_lo, k_hi, torch.full_like(k_lo, ACCEPT_STREAM)).view(B, K)
    accept = u * q_d < p_d  # u < p / q without dividing (q = 0 accepts when p > 0)
    return accept.to(torch.int64).cumprod(1).sum(1)


def _final_draw(P, Q, draft_tokens, n, seed, offset):
    """The token at position n of each row: Gumbel-max over the residual max(0, p - q), or
    over p_K when every draft was accepted (``_bonus`` replaces those). Returns tokens [B]."""
    B, K1, V = P.shape
    K = K1 - 1
    rows = torch.arange(B, device=P.device)
    p_n = P[rows, n]
    at_k = n == K
    if Q is None:
        q_n = torch.zeros_like(p_n)
        q_n[rows[~at_k], draft_tokens[rows[~at_k], n[~at_k]].to(torch.int64)] = 1.0
    else:
        q_n = torch.where(at_k[:, None], 0.0, Q.to(torch.float32)[rows, n.clamp(max=K - 1)])
    # max(0, p - q) vanishes off p's support, which the filters keep small: draw on it alone.
    width = max(1, int((p_n > 0).sum(1).max()))
    p_s, ids = torch.topk(p_n, width, dim=1)
    r = (p_s - q_n.gather(1, ids)).clamp_min(0)
    # Rounding can leave no residual mass where p and q agree: then p itself is the residual.
    r = torch.where((r.sum(1) > 0)[:, None], r, p_s)
    off = offset + n if isinstance(offset, torch.Tensor) else n + offset
    score = torch.where(r > 0, torch.log(r) + rng.gumbel_rows(seed, off, ids), float("-inf"))
    tok, _ = rng.first_best(score, ids, V)
    return tok


def _bonus(target_logits, draft_tokens, p, input_ids, prompt_lens, seed, offset, n, last):
    """Rows that accepted every draft take ``sample()``'s token for position K, with the
    seed at offset + K: exactly the token plain sampling would give there."""
    B, K1, V = target_logits.shape
    rows = (n == K1 - 1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return last

    def sub(v):
        return v[rows] if isinstance(v, torch.Tensor) else v

    has_history = input_ids is not None or p.has_repetition() or p.has_presence_frequency()
    hist = None
    if has_history:
        hist = _extended_history(sub(input_ids), draft_tokens[rows]).view(
            rows.numel(), K1, -1)[:, K1 - 1]
    sp = params.SamplingParams(**{k: sub(v) for k, v in p.as_kwargs().items()})
    off = sub(offset) + (K1 - 1)
    tok, _ = reference.twin_sample(target_logits[rows, K1 - 1], sp, hist, sub(prompt_lens),
                                   sub(seed), off)
    return last.index_put((rows,), tok)


def _emit(P, draft_tokens, n, last, valid):
    """tokens / logprobs [B, K + 1]: accepted drafts, then `last`, then -1 / -inf."""
    B, K1, _ = P.shape
    pos = torch.arange(K1, device=P.device)[None, :]
    drafts = torch.cat([draft_tokens.to(torch.int64), last[:, None]], 1)
    tokens = torch.where(pos < n[:, None], drafts, torch.where(pos == n[:, None], last[:, None],
                                                               -1))
    tokens = torch.where(valid[:, None], tokens, -1)
    lp = torch.log(P.gather(2, tokens.clamp_min(0)[:, :, None]).squeeze(2))
    return tokens, torch.where(tokens >= 0, lp, float("-inf"))


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
    pos = torch.arange(K + 1, device=best.device)[None, :]
    drafts = torch.cat([draft_tokens, best.gather(1, n[:, None])], 1)
    tokens = torch.where(pos < n[:, None], drafts, torch.where(pos == n[:, None], drafts[:, K:],
                                                               -1))
    tokens = torch.where(valid[:, None], tokens, -1)
    logprobs = torch.where(tokens >= 0, 0.0, float("-inf"))
    return SpeculativeOutput(tokens, n, logprobs)


def _raise_invalid_position(target_logits, P):
    bad = ~(P.sum(2) > 0)
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
        backend: "auto", "torch" or "triton"; this release verifies with the torch twin on
            every device (validated, and otherwise unused).

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
    p, input_ids, prompt_lens, seed, offset = params.normalise(
        target_logits[:, 0], values, input_ids, prompt_lens, generator, seed, offset, check,
        backend)
    if seed is None:
        seed, offset = params.draw_seeds(B, target_logits.device, generator, True), 0
    bad_draft = _bad_draft_rows(draft_tokens, draft_probs, V)
    if check and bool(bad_draft.any()):
        _raise_bad_draft(draft_tokens, draft_probs, V, bad_draft)
    safe_drafts = torch.where(bad_draft[:, None], 0, draft_tokens.to(torch.int64))
    fast = _greedy_verify(target_logits, safe_drafts, p, bad_draft, check)
    if fast is not None:
        return fast if return_logprobs else (fast.tokens, fast.num_accepted)
    P = _target_probs(target_logits, safe_drafts, p, input_ids, prompt_lens)
    valid = ~bad_draft & (P.sum(2) > 0).all(1)
    if check and not bool(valid.all()):
        _raise_invalid_position(target_logits, P)
    Q = None if draft_probs is None else torch.where(bad_draft[:, None, None], 0.0,
                                                     draft_probs.to(torch.float32))
    n = torch.where(valid, _accepted(P, Q, safe_drafts, seed, offset), 0)
    last = _final_draw(P, Q, safe_drafts, n, seed, offset)
    last = _bonus(target_logits, safe_drafts, p, input_ids, prompt_lens, seed, offset, n, last)
    tokens, logprobs = _emit(P, safe_drafts, n, last, valid)
    out = SpeculativeOutput(tokens, n, logprobs)
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
