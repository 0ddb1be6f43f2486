"""pytest-benchmark: gpu_sampler.sample vs transformers' processor chain vs a naive torch sampler.

    .venv/bin/python -m pytest bench/test_sampler_bench.py --benchmark-columns=median,iqr
    GPU_SAMPLER_BENCH_DEVICE=cuda ...      on a GPU (the timed call synchronises)
    GPU_SAMPLER_BENCH_QUICK=1 ...          small shapes only

Every provider gets the same logits and history in the same run; the group is the case, so
pytest-benchmark prints the providers of one case side by side. Before timing, each provider's
output is checked (a token inside the support of gpu_sampler.sampling_distribution), so no speed
is reported for a wrong answer.
"""
import os

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper)

import gpu_sampler

DEVICE = os.environ.get("GPU_SAMPLER_BENCH_DEVICE", "cpu")
QUICK = os.environ.get("GPU_SAMPLER_BENCH_QUICK") == "1"

SHAPES = [(1, 32000), (8, 32000)] if QUICK else [(1, 32000), (8, 32000), (64, 128256),
                                                   (256, 151936)]
CONFIGS = {
    "rp1.2-T0.7-k50-p0.9": dict(repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9),
    "T0.7-p0.9": dict(repetition_penalty=1.0, temperature=0.7, top_k=0, top_p=0.9),
}
PROVIDERS = ["gpu_sampler", "hf", "naive"]
HISTORY = 128


def hf_chain(logits, ids, repetition_penalty, temperature, top_k, top_p):
    procs = LogitsProcessorList()
    if repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    procs.append(TopPLogitsWarper(top_p))
    scores = procs(ids, logits.float())
    return torch.multinomial(torch.softmax(scores, -1), 1).squeeze(1)


def naive(logits, ids, repetition_penalty, temperature, top_k, top_p):
    """What a hand-written sampler usually looks like: full sort, cumsum, multinomial."""
    x = logits.float().clone()
    if repetition_penalty != 1.0:
        g = x.gather(1, ids)
        x.scatter_(1, ids, torch.where(g < 0, g * repetition_penalty, g / repetition_penalty))
    x = x / temperature
    sv, si = torch.sort(x, descending=True)
    if top_k:
        sv[:, top_k:] = float("-inf")
    probs = torch.softmax(sv, -1)
    cum = probs.cumsum(-1)
    probs[(cum - probs) >= top_p] = 0.0
    j = torch.multinomial(probs, 1)
    return si.gather(1, j).squeeze(1)


def ours(logits, ids, **kw):
    return gpu_sampler.sample(logits, input_ids=ids, check=False, **kw)


FNS = {"gpu_sampler": ours, "hf": hf_chain, "naive": naive}


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sample(benchmark, shape, config, provider):
    B, V = shape
    kw = CONFIGS[config]
    if kw["top_k"] == 0 and B * V > 64 * 128256 and provider != "gpu_sampler" and DEVICE == "cpu":
        pytest.skip("a full-vocab sort of this size takes seconds per call on CPU")
    gen = torch.Generator().manual_seed(B * 7 + V)
    logits = (torch.randn(B, V, generator=gen) * 3).to(DEVICE)
    ids = torch.randint(0, V, (B, HISTORY), generator=gen).to(DEVICE)
    fn = FNS[provider]

    tok = fn(logits, ids, **kw)
    support = gpu_sampler.sampling_distribution(logits, input_ids=ids, **kw) > 0
    assert support.gather(1, tok[:, None]).all(), f"{provider} drew outside the support"

    def call():
        out = fn(logits, ids, **kw)
        _sync()
        return out

    benchmark.group = f"{B}x{V} {config}"
    benchmark.extra_info.update(provider=provider, batch=B, vocab=V, config=config,
                                device=DEVICE, logits_bytes=logits.numel() * logits.element_size())
    rounds = 3 if B * V >= 64 * 128256 else 10
    benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=1)
