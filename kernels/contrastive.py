"""Contrastive-decoding scores: expert logits, amateur logits -> float32 [B, V] scores.

The scores on their own, for ``gpu_sampler.contrastive.contrastive_scores``: ``sample()`` does
not use this launch, it computes the same scores inside its own launches (``fused_sample(...,
amateur_logits=...)``, kernels/stats.py and kernels/merge.py). The torch twin (the rules, edge
values included) is ``gpu_sampler.contrastive.contrastive_scores_reference``.
"""
import os

import torch
import triton
import triton.language as tl

from .common import _cd_scores, _param
from .launch import exact_fp, log_cut, next_pow2, split_param


@triton.jit
def _contrastive_scores_kernel(
    e_ptr, stride_eb, a_ptr, stride_ab, out_ptr, stride_ob, V,
    la_ptr, la_s, beta_ptr, beta_s,
    LA_T: tl.constexpr, BETA_T: tl.constexpr, TILE: tl.constexpr,
):
    """One program per row: the contrastive objective of O'Brien & Lewis (2023).

    Math per row (fp32; la = log cd_alpha, NaN for an invalid cd_alpha):
        M     = max e (NaN ignored)
        head  = {e > -inf and (e == M or e - M >= la)}
        s     = (1 + beta) * e - beta * a   on the head (e when beta == 0), -inf elsewhere
        s     = NaN where e or a is NaN, and on the whole row when la or beta is invalid

    Passes: 1 over the expert row (V * e_bytes) for M, then 1 over both rows (V * (e_bytes +
    a_bytes)) writing the scores (V * 4 bytes). Total per row: 2 reads of e, 1 of a, 1 write.
    """
    row = tl.program_id(0).to(tl.int64)
    erow = e_ptr + row * stride_eb
    arow = a_ptr + row * stride_ab
    orow = out_ptr + row * stride_ob
    la = _param(la_ptr, la_s, row, LA_T)
    beta = _param(beta_ptr, beta_s, row, BETA_T)
    bad = (la != la) | (beta != beta) | (beta < 0.0) | (beta == float("inf"))

    M = tl.full([], float("-inf"), tl.float32)
    for start in range(0, V, TILE):
        offs = start + tl.arange(0, TILE).to(tl.int64)
        e = tl.load(erow + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        M = tl.maximum(M, tl.max(tl.where(e != e, float("-inf"), e), axis=0))

    for start in range(0, V, TILE):
        offs = start + tl.arange(0, TILE).to(tl.int64)
        inb = offs < V
        e = tl.load(erow + offs, mask=inb, other=float("-inf")).to(tl.float32)
        a = tl.load(arow + offs, mask=inb, other=0.0).to(tl.float32)
        s = tl.where(bad, float("nan"), _cd_scores(e, a, la, beta, M))
        tl.store(orow + offs, s, mask=inb)


def contrastive_scores(logits, amateur_logits, *, cd_alpha=0.1, cd_beta=0.5, tile=None,
                       num_warps=None):
    """Launch ``_contrastive_scores_kernel`` over the rows of ``logits`` [B, V].

    Parameters are validated by the public layer (gpu_sampler.contrastive.contrastive_scores):
    ``amateur_logits`` has the logits' shape and device; cd_alpha / cd_beta are float32-exact
    Python floats or contiguous float32 (B,) tensors. Returns float32 [B, V] scores.
    """
    B, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if amateur_logits.stride(1) != 1:
        amateur_logits = amateur_logits.contiguous()
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if tile is None:
        tile = min(next_pow2(V), 2048 if interp else 1024)
    tile = max(16, tile)
    if num_warps is None:
        num_warps = 8 if tile >= 1024 else 4
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    la_p, la_s, la_t = split_param(log_cut(cd_alpha), logits)
    beta_p, beta_s, beta_t = split_param(cd_beta, logits)
    _contrastive_scores_kernel[(B,)](
        logits, logits.stride(0), amateur_logits, amateur_logits.stride(0), out, out.stride(0), V,
        la_p, float(la_s), beta_p, float(beta_s),
        LA_T=la_t, BETA_T=beta_t, TILE=tile, num_warps=num_warps, **exact_fp(),
    )
    return out
