"""Beam search on Bloom (ALiBi built from the 2-D mask) over a static cache: the prefill's mask
must span the cache's static length, as the greedy loop's does (beam_search._Feed.first)."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from gpu_sampler.hf.cache import StaticKVCache
from gpu_sampler.hf.compat import cache_arg
from gpu_sampler.hf.generation import generate
from gpu_sampler.tiny import seeded_random_model


@pytest.fixture(scope="module")
def bloom():
    config = AutoConfig.for_model("bloom", vocab_size=120, pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2, hidden_size=32, n_layer=2, n_head=4)
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(config), 0, std=0.1)


def _prompts():
    ids = torch.randint(3, 120, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("how", ["own", "passed", "static"])
def test_bloom_beam_search_on_a_static_cache(bloom, how):
    ids, mask = _prompts()
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, num_beams=3,
              num_return_sequences=2, return_dict_in_generate=True, output_scores=True)
    if how == "static":
        kw["cache_implementation"] = "static"
    ref_kw, our_kw = dict(kw), dict(kw)
    if how == "passed":
        ref_kw[cache_arg(bloom)] = StaticKVCache(bloom.config, 6, 30)
        our_kw[cache_arg(bloom)] = StaticKVCache(bloom.config, 6, 30)
    ref = bloom.generate(ids, **ref_kw)
    out = generate(bloom, ids, **our_kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert torch.allclose(out.sequences_scores, ref.sequences_scores, atol=1e-5)
    for a, b in zip(out.scores, ref.scores):
        assert torch.allclose(a, b, atol=1e-5, equal_nan=True)
