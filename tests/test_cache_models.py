"""StaticKVCache on every attention layout it supports, token for token against transformers.

Each case runs ``model.generate(past_key_values=StaticKVCache(...))`` and the default
``model.generate()`` (DynamicCache) on a tiny random model and requires identical sequences:
sliding-window rings (prompts shorter and longer than the window, batch with left padding),
hybrid sliding/full layer stacks, Llama4 chunked attention, GPT-Neo local attention, Falcon
multi-query and ALiBi, Bloom.
"""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from gpu_sampler.hf.cache import StaticKVCache
from gpu_sampler.tiny import seeded_random_model

VOCAB = 300
_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)

# model_type -> config fields (windows of 4-6 so every sequence below outgrows them)
CONFIGS = {
    "mistral_sw": ("mistral", dict(_LLAMA_LIKE, num_hidden_layers=2, sliding_window=5)),
    "qwen2_sw": ("qwen2", dict(_LLAMA_LIKE, num_hidden_layers=3, use_sliding_window=True,
                               sliding_window=4, max_window_layers=1)),
    "gemma2": ("gemma2", dict(_LLAMA_LIKE, num_hidden_layers=3, head_dim=8, sliding_window=5)),
    "gemma3": ("gemma3_text", dict(_LLAMA_LIKE, num_hidden_layers=3, head_dim=8, sliding_window=4,
                                   layer_types=["sliding_attention", "full_attention",
                                                "sliding_attention"])),
    "cohere2": ("cohere2", dict(_LLAMA_LIKE, num_hidden_layers=4, sliding_window=6)),
    "llama4_chunked": ("llama4_text", dict(_LLAMA_LIKE, num_hidden_layers=4, head_dim=8,
                                           intermediate_size_mlp=64, num_local_experts=2,
                                           attention_chunk_size=4)),
    "gpt_neo": ("gpt_neo", dict(hidden_size=32, num_layers=2, num_heads=4, window_size=5,
                                attention_types=[[["global", "local"], 1]],
                                max_position_embeddings=256, intermediate_size=64)),
    "falcon_mq": ("falcon", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 multi_query=True, new_decoder_architecture=False, alibi=False)),
    "falcon_new": ("falcon", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_kv_heads=2, new_decoder_architecture=True, alibi=False)),
    "falcon_alibi": ("falcon", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    multi_query=True, alibi=True)),
    "bloom": ("bloom", dict(hidden_size=32, n_layer=2, n_head=4)),
}


def cache_model(name, seed=0):
    """A tiny random causal LM for CONFIGS[name] (eval, fp32, sdpa where supported)."""
    model_type, fields = CONFIGS[name]
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2, **fields)
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(config), seed, std=0.1)


def _prompts(B, L, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, L), generator=g)
    mask = torch.ones_like(ids)
    for b in range(1, B):
        mask[b, :int(torch.randint(1, L - 1, (1,), generator=g))] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = cache_model(name)
        return cache[name]
    return get


def _same_as_default(model, ids, mask, new, cache, **kw):
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, **kw)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                         past_key_values=cache, **kw)
    assert torch.equal(out, ref), (out, ref)
    return out


# (batch, prompt length, new tokens): prompt shorter than every window, and prefill longer
# than the window with a batch of left-padded rows (the only case for models without windows).
WINDOWED = ("mistral_sw", "qwen2_sw", "gemma2", "gemma3", "cohere2", "llama4_chunked", "gpt_neo")
CASES = [(name, (1, 3, 10)) for name in WINDOWED] + [(name, (3, 9, 7)) for name in CONFIGS]


@pytest.mark.parametrize("name,shape", CASES, ids=lambda c: c if isinstance(c, str) else
                         "B%dL%d" % c[:2])
def test_generate_matches_default_cache(models, name, shape):
    model = models(name)
    B, L, new = shape
    ids, mask = _prompts(B, L, seed=1000 * B + L)
    cache = StaticKVCache(model.config, max_batch_size=B + 1, max_cache_len=L + new + 3)
    _same_as_default(model, ids, mask, new, cache)
    assert cache.get_seq_length() == L + new - 1


@pytest.mark.parametrize("name", ["gemma2", "falcon_mq", "falcon_new"])
def test_eager_allocation_matches_what_the_model_writes(models, name):
    model = models(name)
    ids, mask = _prompts(2, 5, seed=7)
    lazy = StaticKVCache(model.config, 2, 16)
    eager = StaticKVCache(model.config, 2, 16, dtype=torch.float32)
    before = [(layer.keys.shape, layer.keys.data_ptr()) for layer in eager.layers]
    out = _same_as_default(model, ids, mask, 6, lazy)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(ids, past_key_values=eager, **kw), out)
    # The eager buffers were used as allocated (not replaced on the first write).
    assert before == [(layer.keys.shape, layer.keys.data_ptr()) for layer in eager.layers]
    for a, b in zip(lazy.layers, eager.layers):
        assert a.keys.shape == b.keys.shape and torch.equal(a.keys, b.keys)


@pytest.mark.parametrize("name", ["cohere2", "gpt_neo"])
def test_continuation_of_a_filled_cache(models, name):
    model = models(name)
    ids, mask = _prompts(2, 6, seed=3)
    cache = StaticKVCache(model.config, 2, 40)
    first = _same_as_default(model, ids, mask, 7, cache)
    more = torch.cat([first, torch.randint(3, VOCAB, (2, 3))], dim=1)
    more_mask = torch.cat([mask, torch.ones(2, more.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    ref = model.generate(more, attention_mask=more_mask, max_new_tokens=6, do_sample=False)
    out = model.generate(more, attention_mask=more_mask, max_new_tokens=6, do_sample=False,
                         past_key_values=cache)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", ["gemma2", "falcon_alibi", "bloom"])
def test_grow_then_decode_same_as_full_size(models, name):
    model = models(name)
    ids, mask = _prompts(2, 5, seed=11)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False)
    small = StaticKVCache(model.config, 2, 8, dtype=torch.float32)
    # Prefill + 3 steps fit in 8 positions; then double and carry on from the same cache.
    part = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                          past_key_values=small)
    ptrs = [layer.keys.data_ptr() for layer in small.layers]
    small.grow(16)
    small.grow(32)
    assert small.max_cache_len == 32 and all(layer.max_cache_len == 32 for layer in small.layers)
    # Full layers were reallocated at the new length; sliding layers (window 4-6 < 8) kept
    # their ring.
    for layer, p in zip(small.layers, ptrs):
        if layer.is_sliding:
            assert layer.keys.data_ptr() == p and layer.keys.shape[2] == 2 * layer.window
        else:
            assert layer.keys.shape[2] == 32
    part_mask = torch.cat([mask, torch.ones(2, part.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    out = model.generate(part, attention_mask=part_mask, max_new_tokens=11, do_sample=False,
                         past_key_values=small)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", ["gemma2", "falcon_mq", "gpt_neo"])
def test_beam_search_matches_default(models, name):
    model = models(name)
    ids, mask = _prompts(2, 6, seed=5)
    cache = StaticKVCache(model.config, 2 * 4, 20, dtype=torch.float32)
    ptrs = [layer.keys.data_ptr() for layer in cache.layers]
    _same_as_default(model, ids, mask, 9, cache, num_beams=4, num_return_sequences=2)
    # Reordered in place: the beams still live in the preallocated buffers.
    assert ptrs == [layer.keys.data_ptr() for layer in cache.layers]


def test_layer_types_without_a_static_kv_form_refused_naming_the_model():
    config = AutoConfig.for_model("llama", vocab_size=VOCAB,
                                  **dict(_LLAMA_LIKE, num_hidden_layers=2))
    config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(NotImplementedError, match="'linear_attention'.*'llama'"):
        StaticKVCache(config, 1, 16)


@pytest.mark.parametrize("name", ["bloom", "falcon_alibi", "gemma2", "gpt_neo"])
def test_gpu_sampler_generate_matches_transformers(models, name):
    # gpu_sampler.generate builds its own StaticKVCache and passes the 2-D mask the cache asks
    # for (attention_mask_length): ALiBi, sliding and GPT-Neo local layers all come out exact.
    from gpu_sampler.hf.generation import generate

    model = models(name)
    ids, mask = _prompts(3, 9, seed=21)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=9, do_sample=False)
    assert torch.equal(generate(model, ids, attention_mask=mask, max_new_tokens=9,
                                do_sample=False), ref)
