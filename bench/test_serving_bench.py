"""pytest-benchmark: what a serving request adds to a sampling call (issue 21).

    .venv/bin/python -m pytest bench/test_serving_bench.py --benchmark-columns=median,iqr
    GPU_SAMPLER_BENCH_DEVICE=cuda ...      on a GPU (the timed call synchronises)
    GPU_SAMPLER_BENCH_QUICK=1 ...          small shapes only

Two requests, each against the same work done in torch around a plain sample() call, in the
same run and on the same inputs:

    top-N logprobs   sample(..., top_logprobs=N)  vs  sample() + topk(log_softmax(logits))
    mask + bias      sample(..., allowed_mask=, logit_bias=)  vs  unpack the bitmask, -inf the
                     banned ids, scatter-add the bias, then sample()

Every provider's output is checked before timing (top-N ids equal to torch's; the token
allowed by the mask), so no speed is quoted for a wrong answer. The settings are a chat
request's: rp 1.1, T 0.7, top-p 0.9 (with a 128-token history).
"""
import os

import pytest
import torch

import gpu_sampler

DEVICE = os.environ.get("GPU_SAMPLER_BENCH_DEVICE", "cpu")
QUICK = os.environ.get("GPU_SAMPLER_BENCH_QUICK") == "1"
SHAPES = [(8, 32000)] if QUICK else [(8, 32000), (64, 128256)]
SETTINGS = dict(repetition_penalty=1.1, temperature=0.7, top_p=0.9)
HISTORY = 128
BIAS_IDS = 16


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _inputs(B, V):
    gen = torch.Generator().manual_seed(B * 13 + V)
    logits = (torch.randn(B, V, generator=gen) * 3).to(DEVICE)
    ids = torch.randint(0, V, (B, HISTORY), generator=gen).to(DEVICE)
    words = (V + 31) // 32
    # about 3/4 of the vocabulary allowed, as a grammar state mid-way through a JSON value
    mask = gpu_sampler.pack_mask(torch.rand(B, words * 32, generator=gen) < 0.75).to(DEVICE)
    bias = (torch.randint(0, V, (B, BIAS_IDS), generator=gen).to(DEVICE),
            (torch.randn(B, BIAS_IDS, generator=gen) * 2).to(DEVICE))
    return logits, ids, mask, bias


def top_n_ours(logits, ids, n):
    out = gpu_sampler.sample(logits, input_ids=ids, top_logprobs=n, seed=0, check=False,
                             **SETTINGS)
    return out.top_ids, out.top_logprobs


def top_n_torch(logits, ids, n):
    gpu_sampler.sample(logits, input_ids=ids, seed=0, check=False, **SETTINGS)
    top = torch.log_softmax(logits.float(), dim=-1).topk(n, dim=-1)
    return top.indices, top.values


def edits_ours(logits, ids, mask, bias):
    return gpu_sampler.sample(logits, input_ids=ids, allowed_mask=mask, logit_bias=bias,
                              seed=0, check=False, **SETTINGS)


def edits_torch(logits, ids, mask, bias):
    B, V = logits.shape
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((mask[:, :, None] >> shifts) & 1).view(B, -1)[:, :V].bool()
    x = logits.float().masked_fill(~allowed, float("-inf"))
    x.scatter_add_(1, bias[0], bias[1].float())
    return gpu_sampler.sample(x, input_ids=ids, seed=0, check=False, **SETTINGS)


@pytest.mark.parametrize("provider", ["gpu_sampler", "torch"])
@pytest.mark.parametrize("n", [5, 20])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_top_logprobs(benchmark, shape, n, provider):
    logits, ids, _, _ = _inputs(*shape)
    fn = top_n_ours if provider == "gpu_sampler" else top_n_torch
    top_ids, top_lp = fn(logits, ids, n)
    want = torch.log_softmax(logits.float(), dim=-1).topk(n, dim=-1)
    assert torch.equal(top_ids, want.indices), f"{provider}: other top-{n} ids than torch"
    torch.testing.assert_close(top_lp, want.values, atol=1e-5, rtol=0)

    def call():
        out = fn(logits, ids, n)
        _sync()
        return out

    benchmark.group = f"{shape[0]}x{shape[1]} top_logprobs={n}"
    benchmark.extra_info.update(provider=provider, batch=shape[0], vocab=shape[1], n=n,
                                device=DEVICE)
    benchmark.pedantic(call, rounds=3 if shape[1] > 100000 else 10, iterations=1,
                       warmup_rounds=1)


@pytest.mark.parametrize("provider", ["gpu_sampler", "torch"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_mask_and_bias(benchmark, shape, provider):
    logits, ids, mask, bias = _inputs(*shape)
    fn = edits_ours if provider == "gpu_sampler" else edits_torch
    tok = fn(logits, ids, mask, bias)
    word = mask.gather(1, (tok // 32)[:, None]).squeeze(1)
    assert (((word >> (tok % 32).to(torch.int32)) & 1) == 1).all(), f"{provider}: banned token"
    # the same inputs and seed give the same draw whichever side applies the edits
    assert torch.equal(tok, edits_torch(logits, ids, mask, bias))

    def call():
        out = fn(logits, ids, mask, bias)
        _sync()
        return out

    benchmark.group = f"{shape[0]}x{shape[1]} mask+bias"
    benchmark.extra_info.update(provider=provider, batch=shape[0], vocab=shape[1],
                                device=DEVICE)
    benchmark.pedantic(call, rounds=3 if shape[1] > 100000 else 10, iterations=1,
                       warmup_rounds=1)
