"""Token masks and logit bias: what a request bans or shifts before the sampler's rules.

Applied to the logits (or the contrastive scores) before the penalties, in this order:

    allowed_mask  int32 [B, ceil(V / 32)]: bit j of word w set = token 32 w + j allowed (the
                  layout grammar engines such as xgrammar fill); other tokens become -inf
    logit_bias    (ids int64 [B, NB], values float [B, NB]): values added to the logits at
                  ids (duplicates add up; ids < 0 are padding; -inf bans, +inf forces)

A row that allows no token is invalid (ValueError with check=True, token -1 otherwise).
The Triton backend applies them inside its reads of the logits (kernels/common.py
_penalised_tile: the mask words and the block's bias entries, no extra pass); the torch twin,
contrastive scores and vocab-parallel shards apply them here, as one float32 copy of the rows.
"""
from typing import NamedTuple, Optional

import torch

__all__ = ["LogitEdits", "pack_mask", "prepare_edits", "shard_edits", "apply_edits"]


class LogitEdits(NamedTuple):
    allowed: Optional[torch.Tensor]     # bool [B, V], or None: expand ``words``
    bias_ids: Optional[torch.Tensor]    # int64 [B, NB], padding mapped to id 0
    bias_values: Optional[torch.Tensor]  # float32 [B, NB], 0 at padding
    words: Optional[torch.Tensor] = None  # int32 [B, ceil(V / 32)]: the mask as given


def pack_mask(allowed):
    """int32 [B, ceil(V / 32)]: a bool [B, V] mask in the layout ``allowed_mask`` takes (bit j
    of word w set = token 32 w + j allowed; the bits past V are 0).

    Example:
        >>> import torch, gpu_sampler
        >>> gpu_sampler.pack_mask(torch.tensor([[True, False, True]])).tolist()
        [[5]]
    """
    if not isinstance(allowed, torch.Tensor) or allowed.dim() != 2 \
            or allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a bool tensor [B, V], got "
                         f"{getattr(allowed, 'dtype', type(allowed).__name__)} "
                         f"{tuple(getattr(allowed, 'shape', ()))}")
    B, V = allowed.shape
    words = (V + 31) // 32
    bits = torch.zeros(B, words * 32, dtype=torch.int64, device=allowed.device)
    bits[:, :V] = allowed.to(torch.int64)
    w = (bits.view(B, words, 32) << torch.arange(32, device=allowed.device)).sum(2)
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)


def _mask_words(mask, B, V, device):
    """The validated mask, int32 [B, ceil(V / 32)] and contiguous."""
    words = (V + 31) // 32
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.int32 \
            or tuple(mask.shape) != (B, words):
        raise ValueError(f"allowed_mask must be an int32 tensor [B, ceil(V / 32)] = "
                         f"[{B}, {words}], got {getattr(mask, 'dtype', type(mask).__name__)} "
                         f"{tuple(getattr(mask, 'shape', ()))}")
    if mask.device != device:
        raise ValueError(f"allowed_mask must be on the logits' device {device}, got "
                         f"{mask.device}")
    return mask.contiguous()


def _bits(words, V):
    """bool [B, V]: bit j of word w is token 32 w + j."""
    B, W = words.shape
    bits = (words[:, :, None] >> torch.arange(32, device=words.device, dtype=torch.int32)) & 1
    return bits.view(B, W * 32)[:, :V].bool()


def _allowed(mask, B, V, device):
    return _bits(_mask_words(mask, B, V, device), V)


def _bias(logit_bias, B, V, device, check):
    if not isinstance(logit_bias, (tuple, list)) or len(logit_bias) != 2:
        raise ValueError("logit_bias must be a pair (ids LongTensor [B, NB], values float "
                         f"[B, NB]), got {type(logit_bias).__name__}")
    ids, values = logit_bias
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != B \
            or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"logit_bias ids must be an integer tensor [B={B}, NB], got "
                         f"{getattr(ids, 'shape', type(ids).__name__)}")
    if not isinstance(values, torch.Tensor) or values.shape != ids.shape \
            or not values.dtype.is_floating_point:
        raise ValueError(f"logit_bias values must be a float tensor of the ids' shape "
                         f"{tuple(ids.shape)}, got {getattr(values, 'shape', type(values))}")
    if ids.device != device or values.device != device:
        raise ValueError(f"logit_bias must be on the logits' device {device}")
    ids = ids.to(torch.int64)
    values = values.to(torch.float32)
    if check and ids.numel() and int(ids.max()) >= V:
        raise ValueError(f"logit_bias ids contain {int(ids.max())}, which is >= the vocabulary "
                         f"size V={V}")
    if check and bool(values.isnan().any()):
        raise ValueError("logit_bias values contain NaN")
    pad = (ids < 0) | (ids >= V)  # with check=False an out-of-range id is ignored, like padding
    return ids.masked_fill(pad, 0), values.masked_fill(pad, 0.0)


def prepare_edits(logits, allowed_mask, logit_bias, check):
    """Validated edits for ``logits`` [B, V], or None when there are none."""
    if allowed_mask is None and logit_bias is None:
        return None
    B, V = logits.shape
    words = None if allowed_mask is None else _mask_words(allowed_mask, B, V, logits.device)
    if check and words is not None:
        _check_some_allowed(_bits(words, V), V)
    ids = values = None
    if logit_bias is not None:
        ids, values = _bias(logit_bias, B, V, logits.device, check)
    return LogitEdits(None, ids, values, words)


def _check_some_allowed(allowed, V):
    if not bool(allowed.any(1).all()):
        r = int((~allowed.any(1)).nonzero()[0, 0])
        raise ValueError(f"allowed_mask row {r} allows no token of the vocabulary (V={V})")


def shard_edits(allowed_mask, logit_bias, B, V, start, width, device, check):
    """The edits of global-vocabulary arguments for a vocab-parallel shard: its columns
    [start, start + width) of the vocabulary V (columns >= V are padding, left as they are).

    Validated against the global V on every rank alike (the same arguments give the same
    error everywhere). Returns LogitEdits with shard-local ids, or None when there are none.
    """
    if allowed_mask is None and logit_bias is None:
        return None
    allowed = ids = values = None
    if allowed_mask is not None:
        full = _allowed(allowed_mask, B, V, device)
        if check:
            _check_some_allowed(full, V)
        allowed = torch.ones(B, width, dtype=torch.bool, device=device)
        n = max(min(width, V - start), 0)
        allowed[:, :n] = full[:, start:start + n]
    if logit_bias is not None:
        ids, values = _bias(logit_bias, B, V, device, check)
        outside = (ids < start) | (ids >= start + width)
        ids, values = (ids - start).masked_fill(outside, 0), values.masked_fill(outside, 0.0)
    return LogitEdits(allowed, ids, values)


def apply_edits(rows, edits):
    """float32 [B, V]: ``rows`` with the mask and the bias applied (a new tensor)."""
    x = rows.to(torch.float32, copy=True)
    allowed = edits.allowed
    if allowed is None and edits.words is not None:
        allowed = _bits(edits.words, x.shape[1])
    if allowed is not None:
        x.masked_fill_(~allowed, float("-inf"))
    if edits.bias_ids is not None:
        # Duplicate ids add up; index_put_ with accumulate is deterministic per element.
        rows_idx = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(edits.bias_ids)
        x.index_put_((rows_idx, edits.bias_ids), edits.bias_values, accumulate=True)
    return x
