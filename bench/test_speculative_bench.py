"""pytest-benchmark: speculative_sample vs a transformers-style torch verification.

    .venv/bin/python -m pytest bench/test_speculative_bench.py --benchmark-columns=median,iqr

Both providers verify the same K drafts per row from the same target logits with the same
processors (T 0.7, top-k 50, top-p 0.9) in one run. transformers' own `_speculative_sampling`
takes one sequence (batch 1) and already-processed probabilities, so the "hf_style" provider is
what an assisted-generation loop does for a batch: its processor chain over the [B * (K + 1), V]
logits, softmax, then the acceptance rule and the residual draw per row. Before timing, each
provider's emitted tokens are checked to lie in the support of the target's distribution.

``draft="onehot"`` verifies drafts without probabilities (prompt lookup): transformers samples
every position from the processed target and accepts while the draft equals the sample, which
is what gpu_sampler does too (one sampling launch over the B (K + 1) rows on a GPU).
"""
import os

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

import gpu_sampler

DEVICE = os.environ.get("GPU_SAMPLER_BENCH_DEVICE", "cpu")
SHAPES = [(8, 4, 32000), (8, 4, 128256)]
KW = dict(temperature=0.7, top_k=50, top_p=0.9)


def hf_style(target, drafts, q):
    B, K1, V = target.shape
    procs = LogitsProcessorList([TemperatureLogitsWarper(KW["temperature"]),
                                 TopKLogitsWarper(KW["top_k"]), TopPLogitsWarper(KW["top_p"])])
    flat = target.reshape(B * K1, V).float()
    p = torch.softmax(procs(torch.empty(B * K1, 0, dtype=torch.long), flat), -1).view(B, K1, V)
    K = K1 - 1
    d = drafts[:, :, None]
    ratio = p[:, :K].gather(2, d).squeeze(2) / q.gather(2, d).squeeze(2)
    accept = torch.rand(B, K, device=target.device) <= ratio
    n = accept.int().cumprod(1).sum(1)
    out = torch.full((B, K1), -1, dtype=torch.long, device=target.device)
    for b in range(B):  # the residual draw, one row at a time as transformers does
        nb = int(n[b])
        out[b, :nb] = drafts[b, :nb]
        if nb < K:
            r = (p[b, nb] - q[b, nb]).clamp_min(0)
            out[b, nb] = torch.multinomial(r / r.sum(), 1)[0]
        else:
            out[b, nb] = torch.multinomial(p[b, K], 1)[0]
    return out, n


def hf_style_onehot(target, drafts, q=None):
    B, K1, V = target.shape
    procs = LogitsProcessorList([TemperatureLogitsWarper(KW["temperature"]),
                                 TopKLogitsWarper(KW["top_k"]), TopPLogitsWarper(KW["top_p"])])
    flat = target.reshape(B * K1, V).float()
    p = torch.softmax(procs(torch.empty(B * K1, 0, dtype=torch.long), flat), -1)
    drawn = torch.multinomial(p, 1).view(B, K1)
    n = (drawn[:, :K1 - 1] == drafts).int().cumprod(1).sum(1)
    pos = torch.arange(K1, device=target.device)[None, :]
    return torch.where(pos <= n[:, None], drawn, -1), n


def ours(target, drafts, q):
    return gpu_sampler.speculative_sample(target, drafts, q, check=False, seed=1, **KW)


@pytest.mark.parametrize("draft", ["q", "onehot"])
@pytest.mark.parametrize("provider", ["gpu_sampler", "hf_style"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_verify(benchmark, shape, provider, draft):
    B, K, V = shape
    g = torch.Generator().manual_seed(V)
    target = (torch.randn(B, K + 1, V, generator=g) * 3).to(DEVICE)
    q = torch.softmax(target[:, :K] * 0.8 + torch.randn(B, K, V, generator=g).to(DEVICE), -1)
    drafts = torch.stack([torch.multinomial(q[b], 1, generator=g).squeeze(1)
                          for b in range(B)]).to(DEVICE)
    fn = ours if provider == "gpu_sampler" else hf_style if draft == "q" else hf_style_onehot
    if draft == "onehot":
        q = None
    tok, n = fn(target, drafts, q)
    support = gpu_sampler.sampling_distribution(target.reshape(-1, V), **KW).view(B, K + 1, V) > 0
    emitted = tok >= 0
    assert bool(support.gather(2, tok.clamp_min(0)[:, :, None]).squeeze(2)[emitted].all())
    benchmark.group = f"verify {B}x{K}x{V} {draft}"
    benchmark.extra_info.update(provider=provider, mean_accepted=float(n.float().mean()))
    benchmark.pedantic(lambda: fn(target, drafts, q), rounds=5, iterations=1, warmup_rounds=1)
