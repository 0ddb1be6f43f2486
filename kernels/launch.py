"""Host-side helpers every launcher uses (no kernels here): sizes and parameter passing.

``log_cut`` (min-p's and contrastive decoding's cuts, in log space) is the parameter module's
rule, shared with the torch twin: gpu_sampler.params is a leaf that imports neither ops nor
kernels.
"""
import os

import torch

from gpu_sampler.params import log_cut  # noqa: F401 (absolute: works however kernels/ is found)


def next_pow2(n):
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def exact_fp():
    """Launch options that make the GPU round as the interpreter and the torch twin do: no
    contraction of a product and a sum into one fma (Triton 3.9 contracts by default; only an
    explicit tl.fma rounds once, on both sides). Every launcher passes them; the interpreter
    takes no compile options."""
    return {} if os.environ.get("TRITON_INTERPRET") == "1" else {"enable_fp_fusion": False}


def split_param(value, dummy):
    """(pointer tensor, scalar, is_tensor) for a number-or-(B,) parameter: a kernel takes both
    and reads the pointer only when IS_TENSOR (``dummy`` stands in for the pointer)."""
    if isinstance(value, torch.Tensor):
        return value.contiguous(), 0, True
    return dummy, value, False


def edit_table(words, bias_ids, bias_values, B, NT, TILE, device):
    """int32 [B, W + 1 + (NT + 1) + 2 NB]: a request's mask and bias as the loader reads them.

    Per row: ``[mask words (W = ceil(V / 32), or none), NB, start_0 .. start_NT, ids (NB),
    value bits (NB)]``. The words come first so that a block's mask address needs no load (the
    mask word is fetched together with the logits, not after a header); the bias entries are
    sorted by id (stably: duplicates keep their order, so they add up as torch's accumulating
    index_put_ adds them) and block t's entries are ``[start_t, start_{t+1})`` (absolute
    offsets into the row). ``words`` int32 [B, W] or None; ``bias_ids`` int64 [B, NB] (padding
    already mapped to id 0 with value 0, as gpu_sampler/edits.py does) and float32
    ``bias_values``, or None. Built by a few small torch ops, no host sync.
    """
    nb = 0 if bias_ids is None else bias_ids.shape[1]
    nw = 0 if words is None else words.shape[1]
    ids_at = nw + 2 + NT
    table = torch.zeros((B, ids_at + 2 * nb), dtype=torch.int32, device=device)
    if nw:
        table[:, :nw] = words
    table[:, nw] = nb
    if nb:
        sid, order = torch.sort(bias_ids, dim=1, stable=True)
        edges = torch.arange(NT + 1, device=device, dtype=torch.int64) * TILE
        starts = torch.searchsorted(sid, edges.expand(B, NT + 1).contiguous())
        table[:, nw + 1:ids_at] = (starts + ids_at).to(torch.int32)
        table[:, ids_at:ids_at + nb] = sid.to(torch.int32)
        vals = torch.gather(bias_values.to(torch.float32), 1, order).contiguous()
        table[:, ids_at + nb:] = vals.view(torch.int32)
    return table
