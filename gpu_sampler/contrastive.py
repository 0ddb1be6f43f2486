"""Contrastive decoding (O'Brien & Lewis 2023): an expert's logits minus an amateur's.

For one row with expert logits e and amateur logits a over the same vocabulary (float32 math):

    M     = max_i e_i                                   (NaN ignored)
    head  = {i : e_i > -inf and (e_i == M or e_i - M >= log cd_alpha)}
            i.e. p_expert(i) >= cd_alpha * max p_expert; cd_alpha = 0 keeps every token with
            e_i > -inf; when M = +inf and cd_alpha > 0 the head is the +inf tokens
    score = (1 + cd_beta) * e_i - cd_beta * a_i   on the head (= e_i when cd_beta == 0),
            -inf elsewhere

The scores then go through ``sample()``'s usual machinery as if they were the logits: penalties,
temperature (0 = the paper's greedy search), top-k, top-p, min-p and the draw. Edge values:

- NaN anywhere in e or in a makes the row invalid (token -1 / an all-zero distribution, or a
  ValueError with check=True), whether or not the NaN sits in the head: its scores hold NaN.
- a_i = -inf on a head token (with cd_beta > 0) gives score +inf; scores that overflow float32
  are +inf too. The overflow rule of ``sample()`` then keeps only the row's +inf tokens.
- a_i = +inf on a head token gives -inf (the amateur is certain: the token is removed), except
  when e_i = +inf as well: +inf - +inf is undefined and the row is invalid.
- A per-row cd_alpha outside [0, 1] or NaN, or a per-row cd_beta that is negative, NaN or inf,
  makes the row invalid (check=False) or raises ValueError (check=True).

``sample(logits, amateur_logits=...)`` computes these scores inside the sampler's own launches
on the Triton backend (kernels/stats.py, kernels/merge.py: one extra read of the amateur row, no
[B, V] scores in memory) and from ``contrastive_scores_reference`` on the torch backend, with the
same float32 arithmetic, so both backends give the same tokens. ``contrastive_scores`` returns
the scores themselves (Triton kernel ``kernels.contrastive_scores`` or the torch twin).
``generate(..., amateur_model=...)`` (gpu_sampler/hf/amateur.py) runs the amateur on its own
StaticKVCache next to the model and hands its logits to ``sample()`` (or, when processors or
returned scores need them, these scores).
"""
from typing import NamedTuple

import torch

from . import params
from .params import CD_ALPHA, CD_BETA

__all__ = ["contrastive_scores", "contrastive_scores_reference", "CdArgs", "check_cd_param",
           "cd_given"]


class CdArgs(NamedTuple):
    """sample()'s validated contrastive arguments."""
    amateur_logits: torch.Tensor
    alpha: params.Param
    beta: params.Param


def check_cd_param(name, value, B, device, check=True):
    """cd_alpha / cd_beta as a float32-exact Python float or a float32 (B,) tensor.

    Scalars are rounded to float32 before the range test, so both backends see the same value.
    """
    return params.normalise_param(name, value, B, None, device, check)


def cd_given(value, default):
    """True when a contrastive parameter was passed with a value other than its default."""
    return isinstance(value, torch.Tensor) or value != default


def _row_col(v):
    return v[:, None] if isinstance(v, torch.Tensor) else v


@torch.no_grad()
def contrastive_scores_reference(logits, amateur_logits, cd_alpha=CD_ALPHA, cd_beta=CD_BETA):
    """Torch twin of ``kernels.contrastive_scores``: float32 [B, V] scores (module docstring).

    Parameters are already validated: float32-exact Python floats or float32 (B,) tensors.
    Same values as the kernel on valid rows; an invalid row comes back all NaN here (the kernel
    writes NaN at the offending tokens only; both make the row invalid downstream).
    """
    e = logits.to(torch.float32)
    a = amateur_logits.to(torch.float32)
    ninf = float("-inf")
    M = e.amax(1, keepdim=True)  # NaN when the row has one: the row is invalid anyway
    head = (e - M) >= _row_col(params.log_cut(cd_alpha))
    # Only cd_alpha = 0 (log = -inf also admits e = -inf) and M = +inf (inf - inf = NaN) need
    # the full rule; the common case is the two ops above.
    if isinstance(cd_alpha, torch.Tensor) or cd_alpha == 0 or bool((M == float("inf")).any()):
        head = (e > ninf) & (head | (e == M))
    if isinstance(cd_beta, torch.Tensor):
        b = cd_beta[:, None]
        s = torch.where(b == 0, e, (1.0 + b) * e - b * a)
    elif cd_beta == 0:
        s = e.clone()
    else:
        # 1 + beta rounded to float32 once, as the kernel computes it; two roundings, no FMA.
        s = torch.mul(e, params.f32(1.0 + cd_beta))
        s.sub_(torch.mul(a, cd_beta))
    s.masked_fill_(~head, ninf)
    bad = M.squeeze(1).isnan() | a.amax(1).isnan()  # amax propagates NaN: one cheap pass
    for name, v in (("cd_alpha", cd_alpha), ("cd_beta", cd_beta)):
        if isinstance(v, torch.Tensor):
            bad |= params.RULES[name].bad(v)
    return s.masked_fill_(bad[:, None], float("nan"))


def _check_amateur(logits, amateur_logits):
    if not isinstance(amateur_logits, torch.Tensor):
        raise ValueError(f"amateur_logits must be a torch.Tensor, got "
                         f"{type(amateur_logits).__name__}")
    if amateur_logits.shape != logits.shape:
        raise ValueError(f"amateur_logits must have the logits' shape {tuple(logits.shape)} "
                         f"(same batch, same vocabulary), got {tuple(amateur_logits.shape)}")
    if amateur_logits.device != logits.device:
        raise ValueError(f"amateur_logits must be on the logits' device {logits.device}, got "
                         f"{amateur_logits.device}")
    if amateur_logits.dtype not in params.FLOAT_DTYPES:
        raise ValueError(f"amateur_logits must be float32/float16/bfloat16, got dtype "
                         f"{amateur_logits.dtype}")


def _raise_nan_row(logits, amateur_logits, scores):
    r = int(scores.isnan().any(1).nonzero()[0, 0])
    if bool(logits[r].isnan().any()):
        raise ValueError(f"logits row {r} contains NaN")
    if bool(amateur_logits[r].isnan().any()):
        raise ValueError(f"amateur_logits row {r} contains NaN")
    raise ValueError(f"the contrastive score of row {r} is undefined: logits and amateur_logits "
                     f"are both +inf at a token of the plausibility head")


@torch.no_grad()
def contrastive_scores(logits, amateur_logits, *, cd_alpha=CD_ALPHA, cd_beta=CD_BETA, check=True,
                       backend="auto"):
    """The contrastive-decoding scores of each row, float32 [B, V].

    Args:
        logits: expert logits [B, V], float32 / float16 / bfloat16.
        amateur_logits: amateur logits, same shape and device (float32 / float16 / bfloat16).
        cd_alpha: plausibility cut-off in [0, 1]: tokens with p_expert < cd_alpha * max p_expert
            score -inf. A number, or a float tensor [B].
        cd_beta: amateur weight >= 0 (finite): scores are (1 + cd_beta) * logits -
            cd_beta * amateur_logits on the kept tokens. A number, or a float tensor [B].
        check: raise ValueError for a row with NaN (either input) or an undefined score
            (may synchronise); with check=False such rows hold NaN (sample() treats them as
            invalid rows).
        backend: "auto" (Triton on CUDA, torch otherwise), "torch" or "triton".

    Returns:
        float32 [B, V] scores; ``sample(logits, amateur_logits=...)`` samples from them.

    Example:
        >>> import torch
        >>> from gpu_sampler.contrastive import contrastive_scores
        >>> e = torch.tensor([[3.0, 2.0, 0.0]]); a = torch.tensor([[3.0, 0.0, 0.0]])
        >>> contrastive_scores(e, a, cd_alpha=0.2, cd_beta=1.0)
        tensor([[3., 4., -inf]])
    """
    params.check_logits(logits, backend)
    _check_amateur(logits, amateur_logits)
    B = logits.shape[0]
    cd_alpha = check_cd_param("cd_alpha", cd_alpha, B, logits.device, check)
    cd_beta = check_cd_param("cd_beta", cd_beta, B, logits.device, check)
    if B == 0:
        return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if params.pick_backend(backend, logits) == "triton":
        from . import kernels
        scores = kernels.contrastive_scores(logits, amateur_logits, cd_alpha=cd_alpha,
                                            cd_beta=cd_beta)
    else:
        scores = contrastive_scores_reference(logits, amateur_logits, cd_alpha, cd_beta)
    if check and bool(scores.isnan().any()):
        _raise_nan_row(logits, amateur_logits, scores)
    return scores


def contrastive_args(logits, amateur_logits, cd_alpha, cd_beta, check):
    """``sample()``'s contrastive arguments, validated: None without ``amateur_logits``, else
    a ``CdArgs`` with the parameters as float32-exact floats or float32 (B,) tensors."""
    if amateur_logits is None:
        for name, v, default in (("cd_alpha", cd_alpha, CD_ALPHA), ("cd_beta", cd_beta, CD_BETA)):
            if cd_given(v, default):
                raise ValueError(f"{name}={v!r} needs amateur_logits (contrastive decoding)")
        return None
    _check_amateur(logits, amateur_logits)
    B = logits.shape[0]
    return CdArgs(amateur_logits, check_cd_param("cd_alpha", cd_alpha, B, logits.device, check),
                  check_cd_param("cd_beta", cd_beta, B, logits.device, check))


def scores_reference(logits, cd, check):
    """The torch backend's input to the sampler: the scores of ``contrastive_scores_reference``
    (raising for NaN rows with check=True)."""
    scores = contrastive_scores_reference(logits, *cd)
    if check and bool(scores.isnan().any()):
        _raise_nan_row(logits, cd.amateur_logits, scores)
    return scores


def raise_invalid_row(logits, cd, bad, what):
    """The fused (Triton) path found invalid rows: raise what the torch path raises for them.

    Only runs on the error path, so recomputing the scores here costs nothing that matters.
    """
    scores = contrastive_scores_reference(logits, *cd)
    if bool(scores.isnan().any()):
        _raise_nan_row(logits, cd.amateur_logits, scores)
    params.raise_invalid_row(bad, lambda r: bool(scores[r].isnan().any()), what)
