"""Public sampling API: ``sample()`` and ``sampling_distribution()``, backend dispatch.

Layers: kernels/sampling.py (Triton kernel + launcher) and reference.py (torch twin) share one
set of rules (params.py); this module validates once and hands both the same normalised
parameters: a Python number for every row, or a contiguous (B,) tensor (float32, or int64 for
integer ones).
"""
import torch

from . import contrastive, params, reference
from .params import triton_available

__all__ = ["sample", "sampling_distribution", "triton_available"]

_NAMES = params.SAMPLING_NAMES


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


@torch.no_grad()  # sampling has no gradient; skipping autograd bookkeeping is ~20% at B=1
def sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
           presence_penalty=0.0, frequency_penalty=0.0, input_ids=None, prompt_lens=None,
           generator=None, seed=None, offset=None, return_logprobs=False, check=True,
           backend="auto", amateur_logits=None, cd_alpha=params.CD_ALPHA,
           cd_beta=params.CD_BETA):
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
            64-bit: s and s - 2**64 are the same stream.
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

    Returns:
        LongTensor [B], or (tokens [B], logprobs float32 [B]) with return_logprobs.

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
    p, input_ids, prompt_lens, seed, offset = params.normalise(
        logits, values, input_ids, prompt_lens, generator, seed, offset, check, backend)
    cd = contrastive.contrastive_args(logits, amateur_logits, cd_alpha, cd_beta, check)
    B = logits.shape[0]
    if seed is None:
        seed = params.draw_seeds(B, logits.device, generator, params.needs_random(p.temperature))
        offset = 0
    if B == 0:
        tok = torch.empty(0, dtype=torch.int64, device=logits.device)
        logp = torch.empty(0, dtype=torch.float32, device=logits.device)
    elif params.pick_backend(backend, logits) == "triton":
        from . import kernels
        tok, logp = kernels.fused_sample(logits, input_ids=input_ids, prompt_lens=prompt_lens,
                                         seed=seed, offset=offset, **_cd_kwargs(cd),
                                         **p.as_kwargs())
    else:
        tok, logp = reference.twin_sample(_twin_rows(logits, cd, check), p, input_ids,
                                          prompt_lens, seed, offset)
    if check and B > 0:
        bad = tok < 0
        if bool(bad.any()):
            _raise_bad(logits, cd, bad, "sample")
    return (tok, logp) if return_logprobs else tok


@torch.no_grad()
def sampling_distribution(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                          repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                          input_ids=None, prompt_lens=None, check=True, backend="auto",
                          amateur_logits=None, cd_alpha=params.CD_ALPHA,
                          cd_beta=params.CD_BETA):
    """The exact distribution ``sample`` draws from, as float32 [B, V].

    Takes the same filtering / penalty parameters as ``sample`` (see there). Filtered tokens are
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
    if logits.shape[0] == 0:
        return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if params.pick_backend(backend, logits) == "triton":
        from . import kernels
        probs = kernels.fused_sample(logits, input_ids=input_ids, prompt_lens=prompt_lens,
                                     write_probs=True, **_cd_kwargs(cd), **p.as_kwargs())
    else:
        probs = reference.twin_distribution(_twin_rows(logits, cd, check), p, input_ids,
                                            prompt_lens)
    if check:
        bad = ~(probs.sum(1) > 0)
        if bool(bad.any()):
            _raise_bad(logits, cd, bad, "sample from")
    return probs
