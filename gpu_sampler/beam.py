"""The fused beam step, ``beam_topk``, and its torch twin (the op behind beam search).

Per beam row and in one pass: the log-softmax normaliser and the row's best ``k``
candidates of the processed log-probabilities (repetition penalty, temperature, optional -inf
mask, optional Gumbel keys for beam sampling). transformers' beam-search loop around it lives
in gpu_sampler/hf/beam_search.py.
"""
import torch
from torch.nn import functional as F

from . import params, rng
from .rng import ordered_topk

__all__ = ["beam_topk", "beam_topk_reference"]


# ---- the beam step --------------------------------------------------------------------------

def beam_topk_reference(logits, k, *, candidates=None, normalize=True, repetition_penalty=1.0,
                        temperature=1.0, input_ids=None, seed=None, offset=0):
    """Torch twin of ``kernels.beam.beam_topk`` (same arguments, same results).

    On CPU a fused ``log_softmax`` over the row is the fastest normaliser, so the twin forms the
    processed log-probs (transformers' own values, bit for bit) and then keeps k per row.
    """
    x = logits.float()
    N, V = x.shape
    v = F.log_softmax(x, dim=-1) if normalize else x
    if candidates is not None:
        v = v.masked_fill(candidates == float("-inf"), float("-inf"))
    if normalize:
        if input_ids is not None and input_ids.shape[1] > 0 and repetition_penalty != 1.0:
            # Padding (< 0) points at the row's largest id, so every write to an id carries
            # the same value; a row without history rewrites v[:, 0] unchanged.
            top = input_ids.max(dim=1, keepdim=True).values
            ids = torch.where(input_ids < 0, top, input_ids).clamp_min(0)
            g = v.gather(1, ids)
            v.scatter_(1, ids, torch.where(top >= 0, repetition_penalty * g, g))  # lp <= 0
        if temperature != 1.0:
            v = v / temperature
    keys = v
    if seed is not None:
        keys = v + rng.gumbel_rows(seed, offset, torch.arange(V, device=v.device).expand(N, V))
    keys, ids = ordered_topk(keys, k)
    vals = keys if seed is None else v.gather(1, ids)
    if normalize:
        # a row holding NaN or +inf has log_softmax NaN throughout: NaN values and keys, ids
        # 0 .. k - 1 (torch.topk's ids among NaN mean nothing), on both backends
        bad = (torch.isnan(x) | (x == float("inf"))).any(dim=1)
        if bad.any():
            nan = torch.tensor(float("nan"), device=x.device)
            vals = torch.where(bad[:, None], nan, vals)
            keys = torch.where(bad[:, None], nan, keys)
            ids = torch.where(bad[:, None], torch.arange(k, device=x.device), ids)
    return vals, keys, ids


def beam_topk(logits, k, *, candidates=None, normalize=True, repetition_penalty=1.0,
              temperature=1.0, input_ids=None, seed=None, offset=0, backend="auto"):
    """Per row of ``logits``: the ``k`` best beam candidates of the processed log-probs.

    Parameters
    ----------
    logits : float tensor [N, V] (float32/float16/bfloat16), one row per beam.
    k : int, 1 <= k <= V.
    candidates : optional float tensor [N, V]: tokens where it is -inf are excluded (value
        -inf), e.g. ``logits`` after transformers' mask processors; only its -inf pattern is
        read, values and the normaliser come from ``logits``.
    normalize : bool. True: values are ``log_softmax(logits)`` (then penalty, temperature);
        False: ``logits`` are already processed log-probs, taken as they are.
    repetition_penalty : float > 0, applied to the log-probs of tokens in ``input_ids``
        (int [N, L], negative ids ignored) as transformers does (lp * penalty; lp <= 0).
    temperature : float > 0, divides the log-probs.
    seed : optional int64 tensor [N]; with it keys get Gumbel(seed, offset, id) noise, which
        makes the top-k keys a draw of k tokens without replacement (beam sampling).
    backend : "auto" (Triton on CUDA, else torch), "torch" or "triton".

    Returns
    -------
    (values float32 [N, k], keys float32 [N, k], ids int64 [N, k]) sorted by key desc, id asc.
    With normalize, a row holding NaN or +inf gives NaN values and keys and ids 0 .. k - 1
    (its log_softmax is NaN throughout, as in transformers).

    Example
    -------
    >>> import torch
    >>> from gpu_sampler.beam import beam_topk
    >>> v, key, ids = beam_topk(torch.tensor([[0.0, 2.0, 1.0]]), 2)
    >>> ids.tolist()
    [[1, 2]]
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in (
            torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be a float32/float16/bfloat16 [N, V] tensor, got "
                         f"{getattr(logits, 'shape', type(logits))}")
    N, V = logits.shape
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise ValueError(f"k must be an int in [1, V={V}], got {k!r}")
    if backend not in params.BACKENDS:
        raise ValueError(f"backend must be one of {params.BACKENDS}, got {backend!r}")
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a bool, got {normalize!r}")
    if candidates is not None and (not isinstance(candidates, torch.Tensor)
                                   or candidates.shape != logits.shape
                                   or not candidates.dtype.is_floating_point
                                   or candidates.device != logits.device):
        raise ValueError(f"candidates must be a float tensor of the shape of logits "
                         f"{tuple(logits.shape)} on {logits.device}, got "
                         f"{getattr(candidates, 'dtype', type(candidates).__name__)} "
                         f"{tuple(getattr(candidates, 'shape', ()))}")
    # The kernel reads input_ids [N, L] and seed [N] by row: both are checked here (the
    # kernel's docstring relies on it), so that both backends take or refuse the same values.
    input_ids = params.check_history(input_ids, N, V, logits.device, True)
    if seed is not None:
        seed = params.normalise_param("seed", seed, N, V, logits.device, False)
        if not isinstance(seed, torch.Tensor):
            seed = torch.full((N,), seed, dtype=torch.int64, device=logits.device)
    offset = params.int64_seed(offset, "offset")  # one offset for every row (the kernel's)
    for name, v in (("repetition_penalty", repetition_penalty), ("temperature", temperature)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    if not normalize and (repetition_penalty != 1.0 or temperature != 1.0):
        raise ValueError("repetition_penalty / temperature apply to log-probs: use normalize=True")
    kw = dict(candidates=candidates, normalize=normalize,
              repetition_penalty=params.f32(repetition_penalty),  # float32-rounded on the
              temperature=params.f32(temperature),                # host, no tensor
              input_ids=input_ids, seed=seed, offset=offset)
    if params.pick_backend(backend, logits) == "triton":
        from . import kernels
        return kernels.beam_topk(logits, k, **kw)
    return beam_topk_reference(logits, k, **kw)
