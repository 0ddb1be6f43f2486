"""Public sampling API: ``sample()`` and ``sampling_distribution()``, backend dispatch.

Layers: kernels/sampling.py (Triton kernel + launcher) and reference.py (torch twin) share one
set of rules (params.py); this module validates once and hands both the same normalised
parameters: a Python number for every row, or a contiguous (B,) tensor (float32, or int64 for
integer ones).
"""
from typing import NamedTuple, Optional, Tuple

import torch

from . import contrastive, edits, params, reference
from .params import triton_available

__all__ = ["sample", "sampling_distribution", "triton_available", "SampleOutput"]



class SampleOutput(NamedTuple):
    """``sample(..., top_logprobs=N)``'s result.

    Example:
        >>> import torch, gpu_sampler
        >>> out = gpu_sampler.sample(torch.tensor([[0.0, 3.0, 1.0]]), temperature=0.0,
        ...                          top_logprobs=2)  # greedy; the raw top-2 logprobs
        >>> out.tokens.tolist(), out.top_ids.tolist()
        ([1], [[1, 2]])
        >>> [round(v, 4) for v in out.top_logprobs[0].tolist()]
        [-0.1698, -2.1698]
    """
    tokens: torch.Tensor        # int64 [B]
    logprobs: torch.Tensor      # float32 [B], under the distribution sampled from
    top_ids: torch.Tensor       # int64 [B, N], logprob descending, lowest id first on ties
    top_logprobs: torch.Tensor  # float32 [B, N]


def _raise_bad(logits, cd, bad_rows, what):
    """Raise for the first invalid row; with contrastive decoding the message is about its
    scores, the same on both backends."""
    if cd is not None:
        contrastive.raise_invalid_row(logits, cd, bad_rows, what)
    params.raise_invalid_row(bad_rows, lambda r: bool(logits[r].isnan().any()), what)


def _cd_kwargs(cd):
    if cd is None:
        return {}
    return dict(amateur_logits=cd.amateur_logits, cd_alpha=cd.alpha, cd_beta=cd.beta)


def _twin_rows(logits, cd, check):
    return logits if cd is None else contrastive.scores_reference(logits, cd, check)


def _edited(logits, cd, logit_edits, check, backend):
    """(rows, cd, fused) the sampler runs on. The Triton backend takes a mask or bias as it
    reads the logits (``fused``); elsewhere the rows are the edited float32 copy (the
    contrastive scores materialised first, then no fused contrastive step)."""
    if logit_edits is None:
        return logits, cd, None
    if cd is None and params.pick_backend(backend, logits) == "triton":
        return logits, None, logit_edits
    if cd is not None:
        logits = contrastive.contrastive_scores(logits, cd.amateur_logits, cd_alpha=cd.alpha,
                                                cd_beta=cd.beta, check=check, backend=backend)
    return edits.apply_edits(logits, logit_edits), None, None


def _fused_kwargs(fused):
    """fused_sample's mask / bias arguments for the edits it applies itself."""
    if fused is None:
        return {}
    bias = None if fused.bias_ids is None else (fused.bias_ids, fused.bias_values)
    return dict(allowed_words=fused.words, logit_bias=bias)


def _shown(rows, fused):
    """The rows as the sampler saw them, for an error message about one of them."""
    return rows if fused is None else edits.apply_edits(rows, fused)


class _TopRequest(NamedTuple):
    """What ``top_logprobs`` asks of a call: N, raw or processed, and the logits as given."""
    n: int
    raw: bool
    logits: torch.Tensor


def _no_top(B, n, device):
    return (torch.full((B, n), -1, dtype=torch.int64, device=device),
            torch.full((B, n), float("-inf"), device=device))


def _draw(rows, cd, p, input_ids, prompt_lens, seed, offset, backend, fused=None, top=None):
    """(tokens, logprobs, top): the kernel or the twin; invalid rows give -1 / -inf; ``top``
    (ids, logprobs) [B, N] for a _TopRequest, else None."""
    B, dev = rows.shape[0], rows.device
    if top is not None and (B == 0 or top.n == 0):
        tok, logp, _ = _draw(rows, cd, p, input_ids, prompt_lens, seed, offset, backend, fused)
        return tok, logp, _no_top(B, top.n, dev)
    if B == 0:
        return (torch.empty(0, dtype=torch.int64, device=dev),
                torch.empty(0, dtype=torch.float32, device=dev), None)
    if params.pick_backend(backend, rows) != "triton":
        tok, logp = reference.twin_sample(_twin_rows(rows, cd, False), p, input_ids,
                                          prompt_lens, seed, offset)
        return tok, logp, _twin_top(rows, cd, p, input_ids, prompt_lens, top)
    from . import kernels
    # the kernel's own read gives the top-N when it reads the logits as given (raw) or the
    # rows it samples (processed, contrastive scores aside)
    inside = top is not None and (rows is top.logits if top.raw else cd is None)
    out = kernels.fused_sample(rows, input_ids=input_ids, prompt_lens=prompt_lens, seed=seed,
                               offset=offset, **_cd_kwargs(cd), **_fused_kwargs(fused),
                               top_n=top.n if inside else 0, top_n_raw=top is None or top.raw,
                               **p.as_kwargs())
    if top is None or inside:
        return out[0], out[1], (out[2], out[3]) if inside else None
    return out[0], out[1], _top_apart(rows, cd, p, input_ids, prompt_lens, seed, offset, top)


def _twin_top(rows, cd, p, input_ids, prompt_lens, top):
    if top is None:
        return None
    if top.raw:
        return reference.twin_top_n_raw(top.logits, top.n)
    return reference.twin_top_n_processed(_twin_rows(rows, cd, False), p, top.n, input_ids,
                                          prompt_lens)


def _top_apart(rows, cd, p, input_ids, prompt_lens, seed, offset, top):
    """The top-N the draw's own launches could not give: raw logits the caller's edits were
    materialised over, or processed contrastive scores (materialised); one more kernel call
    either way. Raw: the kernel's raw top-N of the logits as given (a greedy call; the twin's
    rule, and no host sync, where the twin's tie fix-up reads .nonzero() on the host)."""
    from . import kernels
    if top.raw:
        out = kernels.fused_sample(top.logits, temperature=0.0, top_n=top.n, top_n_raw=True)
        return out[2], out[3]
    scores = contrastive.contrastive_scores(rows, cd.amateur_logits, cd_alpha=cd.alpha,
                                            cd_beta=cd.beta, check=False, backend="triton")
    out = kernels.fused_sample(scores, input_ids=input_ids, prompt_lens=prompt_lens, seed=seed,
                               offset=offset, top_n=top.n, top_n_raw=False, **p.as_kwargs())
    return out[2], out[3]


def _probs(rows, cd, p, input_ids, prompt_lens, backend, fused=None):
    """float32 [B, V], the distribution ``_draw`` samples from (zero rows where invalid)."""
    if rows.shape[0] == 0:
        return torch.empty(rows.shape, dtype=torch.float32, device=rows.device)
    if params.pick_backend(backend, rows) == "triton":
        from . import kernels
        return kernels.fused_sample(rows, input_ids=input_ids, prompt_lens=prompt_lens,
                                    write_probs=True, **_cd_kwargs(cd), **_fused_kwargs(fused),
                                    **p.as_kwargs())
    return reference.twin_distribution(_twin_rows(rows, cd, False), p, input_ids, prompt_lens)


@torch.no_grad()  # sampling has no gradient; skipping autograd bookkeeping is ~20% at B=1
def sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
           presence_penalty=0.0, frequency_penalty=0.0, input_ids=None, prompt_lens=None,
           generator=None, seed=None, offset=None, return_logprobs=False, check=True,
           backend="auto", amateur_logits=None, cd_alpha=params.CD_ALPHA,
           cd_beta=params.CD_BETA, allowed_mask=None, logit_bias=None, top_logprobs=None,
           logprobs_mode="raw"):
    """Draw one token per row after penalties, temperature, top-k, top-p and min-p.

    Args:
        logits: [B, V] float32 / float16 / bfloat16 (math is float32; float64 is refused),
            V >= 1.
        temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty: a Python number for every row, or a 1-D tensor of length B on the
            logits' device. temperature 0 = greedy for that row (argmax, lowest index on ties);
            top_k 0 or >= V, top_p 1.0, min_p 0.0 = off. Applied in transformers' order:
            repetition -> presence/frequency -> temperature -> top-k -> top-p -> min-p.
            Float values are rounded to float32 first; one float32 cannot hold (not finite,
            or a positive temperature / repetition_penalty that rounds to 0) is refused.
            Extreme values: docs/reliability.md.
        input_ids: [B, L] integer history for the penalties; negative ids are padding.
        prompt_lens: int or LongTensor [B]; presence/frequency count only positions >= it.
        generator: torch.Generator on the logits' device for the draw (default: the device's
            default generator).
        seed, offset: int in [-2**63, 2**64) or LongTensor [B] each; a row's token then depends
            only on its logits, parameters, seed and offset (e.g. offset = position). Ints are
            64-bit: s and s - 2**64 are the same stream. An int is every row's seed, so rows
            with equal logits draw equal tokens (the noise is shared); for independent rows
            (n completions of one prompt) pass one seed per row (``generate`` uses seed + row)
            or no seed.
        return_logprobs: also return the float32 log-probability of each drawn token under
            the distribution it was drawn from (``sampling_distribution``).
        check: validate tensor parameter values and raise ValueError for NaN rows or rows with
            nothing left to sample (may synchronise). With check=False nothing synchronises
            and such rows, and rows with an invalid per-row value (NaN, +-inf, ...), yield
            token -1 (logprob -inf).
        backend: "auto" (Triton kernel on CUDA, torch twin otherwise), "triton" or "torch".
        amateur_logits, cd_alpha, cd_beta: contrastive decoding (gpu_sampler/contrastive.py):
            with amateur_logits [B, V] (same shape and device) the row samples from the scores
            (1 + cd_beta) * logits - cd_beta * amateur_logits on the tokens with
            p >= cd_alpha * max p (others -inf); everything above then applies to the scores.
            cd_alpha in [0, 1], cd_beta >= 0: numbers or float tensors [B]. The Triton backend
            computes the scores inside its own launches (one extra read of amateur_logits).

        allowed_mask, logit_bias: a request's token mask (int32 [B, ceil(V / 32)], bit j of
            word w = token 32 w + j allowed) and bias ((ids int64 [B, NB], values float
            [B, NB]), ids < 0 = padding, duplicates add up, -inf bans), applied to the logits
            (the contrastive scores) before the penalties (gpu_sampler/edits.py).
        top_logprobs: None, or N in [0, 64]: also return the N most likely ids and their
            float32 logprobs per row, from the same read of the logits (kernels/topn.py).
            logprobs_mode "raw" (what OpenAI-style APIs report): log-softmax of ``logits`` as
            given, ordered by logit, lowest id first on equal logits, past the finite logits
            (-1, -inf); a row holding a NaN or +inf logit gets (-1, NaN) everywhere. "processed": the distribution sampled from,
            (x - M) - log Z_f as ``logprobs``, its kept tokens ordered by penalised logit
            (lowest id first on ties), a greedy row's token with 0.0; places past the kept set
            (or V) are (-1, -inf).

    Returns:
        LongTensor [B], or (tokens [B], logprobs float32 [B]) with return_logprobs; with
        top_logprobs, a ``SampleOutput`` (tokens, logprobs, top_ids, top_logprobs).

    Example:
        >>> import torch, gpu_sampler
        >>> logits = torch.randn(4, 1000)
        >>> tok = gpu_sampler.sample(logits, temperature=torch.tensor([0.0, 0.7, 1.0, 0.7]),
        ...                          top_k=50, top_p=0.9, seed=1234, offset=7)
        >>> tok.shape
        torch.Size([4])
    """
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    if torch.compiler.is_compiling():
        extras = dict(amateur_logits=amateur_logits, allowed_mask=allowed_mask,
                      logit_bias=logit_bias, top_logprobs=top_logprobs, generator=generator)
        return _traced_sample(logits, values, input_ids, prompt_lens, seed, offset, extras,
                              return_logprobs, backend)
    p, input_ids, prompt_lens, seed, offset = params.normalise(
        logits, values, input_ids, prompt_lens, generator, seed, offset, check, backend)
    cd = contrastive.contrastive_args(logits, amateur_logits, cd_alpha, cd_beta, check)
    n_top = params.check_top_n(top_logprobs, logprobs_mode)
    rows, cd, fused = _edited(logits, cd, edits.prepare_edits(logits, allowed_mask, logit_bias,
                                                                check), check, backend)
    if seed is None:
        seed = params.draw_seeds(logits.shape[0], logits.device, generator,
                                 params.needs_random(p.temperature))
        offset = 0
    top = None if n_top is None else _TopRequest(n_top, logprobs_mode == "raw", logits)
    tok, logp, top = _draw(rows, cd, p, input_ids, prompt_lens, seed, offset, backend, fused,
                           top)
    if check and logits.shape[0] > 0:
        bad = tok < 0
        if bool(bad.any()):
            _raise_bad(_shown(rows, fused), cd, bad, "sample")
    if n_top is None:
        return (tok, logp) if return_logprobs else tok
    return SampleOutput(tok, logp, *top)


# ---- the torch op: what torch.compile traces ----------------------------------------------

@torch.library.custom_op("gpu_sampler::sample", mutates_args=())
def _sample_op(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor, min_p: torch.Tensor, repetition_penalty: torch.Tensor,
               presence_penalty: torch.Tensor, frequency_penalty: torch.Tensor,
               input_ids: Optional[torch.Tensor], prompt_lens: Optional[torch.Tensor],
               seed: torch.Tensor, offset: torch.Tensor, backend: str
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.gpu_sampler.sample``: ``sample(check=False, return_logprobs=True)`` with
    every parameter a [B] tensor; an opaque op, so a compiled graph keeps no host sync of it."""
    return sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty, input_ids=input_ids,
                  prompt_lens=prompt_lens, seed=seed, offset=offset, return_logprobs=True,
                  check=False, backend=backend)


@_sample_op.register_fake
def _(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
      frequency_penalty, input_ids, prompt_lens, seed, offset, backend):
    B = logits.shape[0]
    return (logits.new_empty(B, dtype=torch.int64), logits.new_empty(B, dtype=torch.float32))


def _traced_sample(logits, values, input_ids, prompt_lens, seed, offset, extras,
                   return_logprobs, backend):
    """``sample()`` inside torch.compile: the op, with parameters as [B] tensors. Validation
    runs in the op's eager body (check=False semantics: invalid rows give -1)."""
    unsupported = [k for k, v in extras.items() if v is not None]
    if unsupported:
        raise NotImplementedError(f"sample() under torch.compile does not take {unsupported} "
                                  "yet: call it outside the compiled region")
    rows, prompt_lens, seed, offset = params.op_params(values, prompt_lens, seed, offset,
                                                       logits.shape[0], logits.device)
    tok, logp = torch.ops.gpu_sampler.sample(
        logits, input_ids=input_ids, prompt_lens=prompt_lens, seed=seed, offset=offset,
        backend=backend, **rows)
    return (tok, logp) if return_logprobs else tok


@torch.no_grad()
def sampling_distribution(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                          repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                          input_ids=None, prompt_lens=None, check=True, backend="auto",
                          amateur_logits=None, cd_alpha=params.CD_ALPHA,
                          cd_beta=params.CD_BETA, allowed_mask=None, logit_bias=None):
    """The exact distribution ``sample`` draws from, as float32 [B, V].

    Takes the same filtering / penalty / mask / bias parameters as ``sample`` (see there). Filtered tokens are
    0; rows with temperature 0 are one-hot at the argmax. Invalid rows (NaN, nothing left) raise
    ValueError with check=True, and are all zeros with check=False.

    Example:
        >>> import torch, gpu_sampler
        >>> p = gpu_sampler.sampling_distribution(torch.tensor([[2.0, 1.0, 1.0, -1.0]]), top_k=2)
        >>> p[0, 3].item()
        0.0
    """
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    p, input_ids, prompt_lens, _, _ = params.normalise(
        logits, values, input_ids, prompt_lens, check=check, backend=backend)
    cd = contrastive.contrastive_args(logits, amateur_logits, cd_alpha, cd_beta, check)
    rows, cd, fused = _edited(logits, cd, edits.prepare_edits(logits, allowed_mask, logit_bias,
                                                                check), check, backend)
    probs = _probs(rows, cd, p, input_ids, prompt_lens, backend, fused)
    if check and logits.shape[0] > 0:
        bad = ~(probs.sum(1) > 0)
        if bool(bad.any()):
            _raise_bad(_shown(rows, fused), cd, bad, "sample from")
    return probs
