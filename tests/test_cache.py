"""StaticKVCache against transformers' own generate() and cache behaviour."""
import pytest
import torch

from gpu_sampler.cache import StaticKVCache
from tests.models import ARCHS, tiny_model


def _prompts(B, L, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, L), generator=g)
    mask = torch.ones_like(ids)
    for b in range(B):
        pad = int(torch.randint(0, L - 1, (1,), generator=g)) if b else 0
        mask[b, :pad] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return request.param, tiny_model(request.param, seed=11)


def test_hf_generate_with_static_kv_cache_matches_default(arch_model):
    arch, model = arch_model
    ids, mask = _prompts(3, 9, 1000, seed=torch.seed() % 2**31)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    cache = StaticKVCache(model.config, max_batch_size=4, max_cache_len=32)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                         past_key_values=cache)
    assert torch.equal(out, ref)
    assert cache.get_seq_length() == ref.shape[1] - 1
    k = cache.layers[0].keys
    assert k.shape[0] == 4 and k.shape[2] == 32


def test_reset_reuses_storage_and_smaller_batch_uses_views():
    model = tiny_model("llama", seed=3)
    cache = StaticKVCache(model.config, max_batch_size=4, max_cache_len=24)
    ids, mask = _prompts(3, 6, 1000, seed=torch.seed() % 2**31)
    model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                   past_key_values=cache)
    ptrs = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    cache.reset()
    assert cache.get_seq_length() == 0
    ids2, mask2 = _prompts(2, 8, 1000, seed=torch.seed() % 2**31)
    ref = model.generate(ids2, attention_mask=mask2, max_new_tokens=6, do_sample=False)
    out = model.generate(ids2, attention_mask=mask2, max_new_tokens=6, do_sample=False,
                         past_key_values=cache)
    assert torch.equal(out, ref)
    assert ptrs == [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]


def test_update_writes_in_place_at_position():
    model = tiny_model("gpt2")
    cache = StaticKVCache(model.config, max_batch_size=2, max_cache_len=8, dtype=torch.float32)
    layer = cache.layers[1]
    ptr = layer.keys.data_ptr()
    k1, v1 = torch.randn(2, 4, 3, 16), torch.randn(2, 4, 3, 16)
    k2, v2 = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16)
    cache.update(k1, v1, 0)
    K, V = cache.update(k1, v1, 1)
    assert K.data_ptr() == ptr and K.shape == (2, 4, 8, 16)
    assert torch.equal(K[:, :, :3], k1) and torch.equal(V[:, :, :3], v1)
    cache.update(k2, v2, 0)
    K, V = cache.update(k2, v2, 1)
    assert K.shape[0] == 1 and K.data_ptr() == ptr
    assert torch.equal(K[:, :, 3:4], k2) and torch.equal(K[:, :, :3], k1[:1])
    assert cache.get_seq_length() == 4


def test_overflow_raises_before_writing():
    model = tiny_model("llama")
    cache = StaticKVCache(model.config, max_batch_size=2, max_cache_len=8)
    ids = torch.randint(3, 1000, (2, 6))
    model(ids, past_key_values=cache, use_cache=True)
    before = [layer.keys.clone() for layer in cache.layers]
    with pytest.raises(ValueError, match=r"max_cache_len=8") as e:
        model(torch.randint(3, 1000, (2, 3)), past_key_values=cache, use_cache=True)
    assert "9" in str(e.value)
    assert cache.get_seq_length() == 6
    assert all(torch.equal(b, layer.keys) for b, layer in zip(before, cache.layers))
    with pytest.raises(ValueError, match="max_cache_len"):
        model.generate(torch.randint(3, 1000, (1, 12)), past_key_values=StaticKVCache(
            model.config, 1, 8), max_new_tokens=2)


def test_batch_larger_than_max_batch_size_raises():
    model = tiny_model("llama")
    cache = StaticKVCache(model.config, max_batch_size=2, max_cache_len=16)
    with pytest.raises(ValueError, match=r"batch size 3 exceeds .*max_batch_size=2"):
        model(torch.randint(3, 1000, (3, 4)), past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 0


def test_sliding_window_configs_refused_or_exact():
    mistral = tiny_model("mistral", sliding_window=8)
    with pytest.raises(ValueError, match="sliding_window=8"):
        StaticKVCache(mistral.config, 1, 32)
    # A window that never binds is plain causal attention: exact.
    cache = StaticKVCache(mistral.config, 2, 8)
    ids = torch.randint(3, 1000, (2, 4))
    ref = mistral.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(mistral.generate(ids, max_new_tokens=4, do_sample=False,
                                        past_key_values=cache), ref)
    qwen = tiny_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    with pytest.raises(ValueError, match="sliding_attention"):
        StaticKVCache(qwen.config, 1, 32)


@pytest.mark.parametrize("bad", [dict(max_batch_size=0), dict(max_cache_len=-1),
                                 dict(max_cache_len=2.5)])
def test_bad_sizes(bad):
    kw = dict(max_batch_size=1, max_cache_len=8)
    kw.update(bad)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        StaticKVCache(tiny_model("llama").config, **kw)
