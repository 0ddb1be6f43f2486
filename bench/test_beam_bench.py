"""Beam search throughput: gpu_sampler.generate vs transformers' model.generate, same run.

num_beams 4, batch 4, the ~20M-parameter random Llama of the other benchmarks (fp32; CUDA when
available), vocab 32000 and 128256. Every provider generates exactly NEW_TOKENS tokens per
sequence (min_new_tokens = max_new_tokens). tokens/s = batch * new tokens / median seconds
(beams not counted), stored in ``benchmark.extra_info["tokens_per_s"]`` (and from the best
round in ``tokens_per_s_best``: the shared CPU box is noisy); the hf case also records the
ratios ours / hf.

    nice -n 10 .venv/bin/python -m pytest bench/test_beam_bench.py -q -p no:randomly \\
        --benchmark-columns=median,rounds
"""
import os

import pytest
import torch

from gpu_sampler.hf.generation import generate
from tests.models import llama_20m

QUICK = bool(os.environ.get("GPU_SAMPLER_BENCH_QUICK"))
NEW_TOKENS = 8 if QUICK else 32
VOCABS = (32000,) if QUICK else (32000, 128256)
ROUNDS = 1 if QUICK else 5
BATCH, NUM_BEAMS, PROMPT_LEN = 4, 4, 32
PROVIDERS = ("gpu_sampler", "hf")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

_models = {}
_tokens_per_s = {}
_sequences = {}


def _model(vocab):
    if vocab not in _models:
        _models.clear()  # one vocab at a time keeps memory flat
        _models[vocab] = llama_20m(vocab_size=vocab).to(DEVICE)
    return _models[vocab]


def _prompts(vocab):
    g = torch.Generator().manual_seed(vocab)
    ids = torch.randint(3, vocab, (BATCH, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    for b in range(1, BATCH):  # left padding of different lengths
        mask[b, : (b * 5) % (PROMPT_LEN // 2)] = 0
    ids[mask == 0] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


# gpu_sampler first so the hf case can report the ratio.
CASES = [pytest.param(v, p, id=f"llama-v{v}-b{BATCH}-beams{NUM_BEAMS}-{p}")
         for v in VOCABS for p in PROVIDERS]


@pytest.mark.parametrize("vocab,provider", CASES)
def test_beam_search_throughput(benchmark, vocab, provider):
    model = _model(vocab)
    ids, mask = _prompts(vocab)
    kw = dict(num_beams=NUM_BEAMS, do_sample=False, length_penalty=1.0,
              max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    fn = (lambda: generate(model, ids, attention_mask=mask, **kw)) if provider == "gpu_sampler" \
        else (lambda: model.generate(ids, attention_mask=mask, **kw))
    out = benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    assert out.shape == (BATCH, PROMPT_LEN + NEW_TOKENS)
    tps = BATCH * NEW_TOKENS / benchmark.stats.stats.median
    best = BATCH * NEW_TOKENS / benchmark.stats.stats.min
    _tokens_per_s[(vocab, provider)] = (tps, best)
    benchmark.extra_info.update(tokens_per_s=tps, tokens_per_s_best=best, new_tokens=NEW_TOKENS,
                                batch=BATCH, num_beams=NUM_BEAMS, device=DEVICE)
    _sequences[(vocab, provider)] = out
    ours = _tokens_per_s.get((vocab, "gpu_sampler"))
    if provider == "hf" and ours is not None:
        # A speed number only for checked output: the sequences must be transformers'.
        assert torch.equal(_sequences[(vocab, "gpu_sampler")], out)
        benchmark.extra_info["ratio_gpu_sampler_over_hf"] = ours[0] / tps
        benchmark.extra_info["ratio_best_gpu_sampler_over_hf"] = ours[1] / best
