"""StaticKVCache against transformers' own generate() and cache behaviour."""
import pytest
import torch

from gpu_sampler.hf.cache import StaticKVCache
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


def _states(b, n, seed, heads=2, dim=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, heads, n, dim, generator=g), torch.randn(b, heads, n, dim, generator=g)


@pytest.mark.parametrize("chunks", [[3, 1, 1, 1, 1, 1, 1, 1], [9, 1, 1, 1], [2, 3, 1, 1, 5, 1, 4],
                                    [4, 1, 1, 1, 1, 2, 1]])
def test_sliding_ring_returns_what_transformers_static_sliding_layer_returns(chunks):
    from transformers.cache_utils import StaticSlidingWindowLayer

    from gpu_sampler.hf.cache import StaticSlidingKVLayer

    window = 4
    ours = StaticSlidingKVLayer(max_batch_size=2, max_cache_len=64, sliding_window=window)
    theirs = StaticSlidingWindowLayer(max_cache_len=64, sliding_window=window)
    for i, n in enumerate(chunks):
        assert ours.get_mask_sizes(n) == theirs.get_mask_sizes(n)
        k, v = _states(2, n, seed=i)
        K, V = ours.update(k, v)
        K_ref, V_ref = theirs.update(k, v)
        assert torch.equal(K, K_ref) and torch.equal(V, V_ref)
        assert ours.get_seq_length() == theirs.get_seq_length()
        if n == 1:
            # Decoding hands out a view of the ring itself: nothing copied, nothing allocated.
            assert K.untyped_storage().data_ptr() == ours.keys.untyped_storage().data_ptr()
    assert ours.keys.shape[2] == 2 * window


def test_cache_picks_layer_types_like_transformers_static_cache():
    from transformers import StaticCache

    model = tiny_model("qwen2", num_layers=3, use_sliding_window=True, sliding_window=4,
                       max_window_layers=1)
    ours = StaticKVCache(model.config, 1, 32)
    theirs = StaticCache(model.config, max_cache_len=32)
    assert ours.is_sliding == theirs.is_sliding == [False, True, True]
    for n in (1, 5):
        for i in range(3):
            assert ours.get_mask_sizes(n, i) == theirs.get_mask_sizes(n, i)


def test_device_mismatch_refused_before_any_layer_is_written():
    model = tiny_model("llama")
    cache = StaticKVCache(model.config, 2, 16, dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match="meta.*cpu|cpu.*meta"):
        model(torch.randint(3, 1000, (2, 4)), past_key_values=cache, use_cache=True)
    assert [layer.get_seq_length() for layer in cache.layers] == [0, 0]
    with pytest.raises(ValueError, match="model's device"):
        cache.check_capacity(2, 8, device="cpu")


def test_check_capacity_finds_every_problem_up_front():
    model = tiny_model("llama")
    cache = StaticKVCache(model.config, 2, 16)
    cache.check_capacity(2, 16, device="cpu", input_len=5)
    with pytest.raises(ValueError, match=r"batch size 3 .*max_batch_size=2"):
        cache.check_capacity(3, 8)
    with pytest.raises(ValueError, match=r"needs 17 positions.*max_cache_len=16.*grow\(17\)"):
        cache.check_capacity(1, 17)
    model(torch.randint(3, 1000, (2, 6)), past_key_values=cache, use_cache=True)
    # A fresh prompt no longer than what is cached cannot be a continuation: ask for reset().
    with pytest.raises(ValueError, match=r"holds 6 positions.*reset\(\)"):
        cache.check_capacity(2, 12, input_len=6)
    cache.check_capacity(2, 12, input_len=8)  # extends the cached 6: continuation
    with pytest.raises(ValueError, match=r"reset\(\)"):
        cache.update(*_states(2, 0, seed=0, dim=16), 0)
    assert cache.get_seq_length() == 6


def test_reorder_select_and_repeat_work_in_place():
    model = tiny_model("mistral", sliding_window=4)
    cache = StaticKVCache(model.config, 6, 16, dtype=torch.float32)
    ptrs = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    k, v = _states(3, 6, seed=1, dim=16)
    for i in range(len(cache.layers)):
        cache.update(k, v, i)
    layer = cache.layers[1]
    rows = layer.keys[:3].clone()
    cache.batch_repeat_interleave(2)
    assert torch.equal(layer.keys[:6], rows.repeat_interleave(2, dim=0))
    beam_idx = torch.tensor([5, 5, 0, 2, 1, 3])
    before = layer.keys[:6].clone()
    cache.reorder_cache(beam_idx)
    assert torch.equal(layer.keys[:6], before[beam_idx])
    before = layer.keys[:6].clone()
    cache.batch_select_indices(torch.tensor([4, 1]))
    assert torch.equal(layer.keys[:2], before[[4, 1]])
    assert ptrs == [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    with pytest.raises(ValueError, match="max_batch_size=6"):
        cache.batch_repeat_interleave(4)


def test_grow_keeps_contents_and_widens_a_bounded_window():
    from transformers.cache_utils import StaticSlidingWindowLayer

    model = tiny_model("mistral", sliding_window=6)
    cache = StaticKVCache(model.config, 1, 4, dtype=torch.float64)
    layer = cache.layers[0]
    assert layer.window == 4
    theirs = StaticSlidingWindowLayer(max_cache_len=64, sliding_window=6)
    k, v = _states(1, 3, seed=2, heads=2, dim=16)
    layer.update(k.double(), v.double())
    theirs.update(k.double(), v.double())
    with pytest.raises(ValueError, match="only enlarges"):
        cache.grow(3)
    cache.grow(32)
    assert layer.window == 6 and layer.keys.dtype == torch.float64
    for i in range(8):
        k, v = _states(1, 1, seed=10 + i, heads=2, dim=16)
        K, _ = layer.update(k.double(), v.double())
        assert torch.equal(K, theirs.update(k.double(), v.double())[0])


@pytest.mark.parametrize("bad", [dict(max_batch_size=0), dict(max_cache_len=-1),
                                 dict(max_cache_len=2.5)])
def test_bad_sizes(bad):
    kw = dict(max_batch_size=1, max_cache_len=8)
    kw.update(bad)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        StaticKVCache(tiny_model("llama").config, **kw)


def test_crop_follows_transformers_and_refuses_what_a_ring_cannot_undo():
    model = tiny_model("qwen2", num_layers=2, use_sliding_window=True, sliding_window=4,
                       max_window_layers=1)
    cache = StaticKVCache(model.config, 1, 32)
    ids = torch.randint(3, 1000, (1, 7))
    model(ids[:, :3], past_key_values=cache, use_cache=True)
    cache.crop(0)
    cache.crop(-2)  # not wrapped yet: any rollback
    assert cache.get_seq_length() == 1
    with pytest.raises(ValueError, match="negative"):
        cache.crop(3)
    model(ids[:, 1:7], past_key_values=cache, use_cache=True)  # 7 positions, window 4 wrapped
    with pytest.raises(ValueError, match="sliding-window"):
        cache.crop(-2)
    assert [layer.get_seq_length() for layer in cache.layers] == [7, 7]
    cache.crop(-1)
    # Re-feeding the dropped token gives the logits of an uncropped run.
    out = model(ids[:, 6:7], past_key_values=cache, use_cache=True).logits
    ref = model(ids, use_cache=False).logits[:, -1:]
    torch.testing.assert_close(out, ref)


def test_prompt_lookup_decoding_rolls_back_with_crop():
    # Assisted decoding feeds candidate tokens and crops the rejected ones off the cache.
    model = tiny_model("llama", seed=4)
    ids = torch.randint(3, 40, (1, 12), generator=torch.Generator().manual_seed(4))
    kw = dict(max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=3)
    ref = model.generate(ids, **kw)
    assert torch.equal(model.generate(ids, past_key_values=StaticKVCache(model.config, 1, 40),
                                      **kw), ref)


def test_crop_takes_an_integer_tensor_count():
    # transformers 5.17's assisted decoding passes the count as a 0-dim tensor.
    model = tiny_model("llama", seed=4)
    cache = StaticKVCache(model.config, 1, 40)
    model(torch.randint(3, 40, (1, 6)), past_key_values=cache)
    cache.crop(torch.tensor(-2))
    assert cache.get_seq_length() == 4
    cache.crop(torch.tensor(0))
    assert cache.get_seq_length() == 4
    with pytest.raises(ValueError, match="negative number"):
        cache.crop(torch.tensor(1.0))


def test_constructs_where_cache_declares_read_only_size_properties(monkeypatch):
    """transformers <= 5.17 (the GPU machine's version) makes Cache.max_batch_size and
    Cache.max_cache_len read-only properties; the constructor raised there before the fix."""
    from transformers.cache_utils import Cache

    monkeypatch.setattr(Cache, "max_batch_size", property(lambda self: -1), raising=False)
    monkeypatch.setattr(Cache, "max_cache_len", property(lambda self: -1), raising=False)
    cfg = tiny_model("llama").config
    cache = StaticKVCache(cfg, max_batch_size=2, max_cache_len=16)
    assert (cache.max_batch_size, cache.max_cache_len) == (2, 16)
    cache.grow(32)
    assert cache.max_cache_len == 32


def test_layer_plan_reads_shared_layer_kwargs_of_older_transformers(monkeypatch):
    """transformers <= 5.17 returns one kwargs dict for every layer (a list per layer since):
    each layer must still get its window (zipping the dict dropped layers there)."""
    import gpu_sampler.hf.cache as cache_mod

    cfg = tiny_model("mistral").config
    types = ["sliding_attention"] * cfg.num_hidden_layers
    monkeypatch.setattr(cache_mod, "get_layer_types_and_kwargs",
                        lambda config: (types, {"sliding_window": cfg.sliding_window}))
    cache = StaticKVCache(cfg, max_batch_size=1, max_cache_len=64)
    assert len(cache.layers) == cfg.num_hidden_layers
    assert all(layer.sliding_window == cfg.sliding_window for layer in cache.layers)
