"""generate() against model.generate() on several decoder-only architectures.

In the spirit of transformers' GenerationTesterMixin (own cases, not its code): greedy tokens,
left padding, inputs_embeds, output structures and shapes, the returned cache type, continuing
from a returned cache, cache_implementation="static", use_cache=False, num_return_sequences and
eos lists. Architectures cover full attention (llama, qwen2, gpt2), sliding windows shorter
than the sequence (mistral, gemma2 with alternating sliding / full layers) and ALiBi (bloom,
falcon with alibi=True). Models are tiny (vocab 128, hidden 32, 2 layers) with eager attention,
which returns attention weights.
"""
import pytest
import torch
from transformers import (AutoConfig, AutoModelForCausalLM, DynamicCache, GenerationConfig,
                          StaticCache)
from transformers.generation import logits_process as lp

from gpu_sampler.hf.cache import StaticKVCache
from gpu_sampler.hf.generation import generate
from gpu_sampler.hf.patch import patch
from gpu_sampler.tiny import seeded_random_model
from tests.models import left_padded

V = 128
_DECODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, max_position_embeddings=256)
CONFIGS = {
    "llama": _DECODER,
    "qwen2": _DECODER,
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=256),
    # Windows of 5 positions: shorter than every sequence below, so they bind.
    "mistral": dict(_DECODER, sliding_window=5),
    "gemma2": dict(_DECODER, sliding_window=5, head_dim=8, query_pre_attn_scalar=8),
    "bloom": dict(hidden_size=32, n_layer=2, n_head=4),
    "falcon": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                   new_decoder_architecture=False, multi_query=True, max_position_embeddings=256),
}
ARCHS = list(CONFIGS)


def _model(arch, seed=0):
    config = AutoConfig.for_model(arch, vocab_size=V, pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2, **CONFIGS[arch])
    config._attn_implementation = "eager"
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(config), seed, std=0.2)


_MODELS = {}


def _shared(arch):
    if arch not in _MODELS:
        _MODELS[arch] = _model(arch)
    return _MODELS[arch]


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return _shared(request.param)


# One of each kind (full attention, sliding + full layers, ALiBi) for the costlier checks.
@pytest.fixture(scope="module", params=["llama", "gemma2", "bloom"])
def some_model(request):
    return _shared(request.param)


GREEDY = dict(do_sample=False, eos_token_id=None)


def test_greedy_left_padding(model):
    ids, mask = left_padded([7, 4, 2], 1, vocab=V)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=10, **GREEDY)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=10, **GREEDY)
    assert torch.equal(out, ref)
    # A padded row gives the tokens of the same prompt unpadded.
    alone = generate(model, ids[2:, -2:], max_new_tokens=10, **GREEDY)
    assert torch.equal(alone[0, 2:], out[2, ids.shape[1]:])


def test_inputs_embeds(model):
    ids, mask = left_padded([6, 3], 2, vocab=V)
    embeds = model.get_input_embeddings()(ids)
    for extra in (dict(), dict(input_ids=ids)):
        kw = dict(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=5, **GREEDY, **extra)
        ref = model.generate(**kw)
        out = generate(model, **kw)
        assert torch.equal(out, ref) and out.shape[1] == 5 + (ids.shape[1] if extra else 0)


def test_inputs_embeds_penalty_history_like_hf(model):
    # transformers ignores the sequences' columns before the mask's first attended position;
    # from inputs_embeds alone the sequences hold new tokens only, so on a left-padded row its
    # first generated tokens escape the penalty. The scores show it at every step.
    ids, mask = left_padded([6, 2], 4, vocab=V)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    kw = dict(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=6, do_sample=False,
              repetition_penalty=1.8, return_dict_in_generate=True, output_scores=True)
    ref = model.generate(**kw)
    out = generate(model, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _assert_same_structure(ours, ref, what):
    assert isinstance(ours, tuple) and len(ours) == len(ref), what
    for i, (a, b) in enumerate(zip(ours, ref)):
        if isinstance(b, tuple):
            _assert_same_structure(a, b, f"{what}[{i}]")
        else:
            assert a.shape == b.shape, (what, i, a.shape, b.shape)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"{what}[{i}]")


def test_output_structure_and_cache_type(model):
    _check_outputs(model, None)


def test_static_cache_implementation(some_model):
    # (transformers' own generate fails for Falcon ALiBi with a static cache: it hands Falcon a
    # 4-D mask where Falcon builds ALiBi from a 2-D one; gpu_sampler works there.)
    _check_outputs(some_model, "static")


def _check_outputs(model, cache_implementation):
    ids, mask = left_padded([5, 3], 3, vocab=V)
    kw = dict(attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True,
              output_scores=True, output_logits=True, output_attentions=True,
              output_hidden_states=True, cache_implementation=cache_implementation, **GREEDY)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    for name in ("scores", "logits", "attentions", "hidden_states"):
        _assert_same_structure(getattr(out, name), getattr(ref, name), name)
    assert type(out.past_key_values) is type(ref.past_key_values)
    assert type(ref.past_key_values) is (StaticCache if cache_implementation else DynamicCache)
    assert out.past_key_values.get_seq_length() == ref.past_key_values.get_seq_length()
    assert out.past_key_values.get_max_length() == ref.past_key_values.get_max_length()
    _assert_same_cache(out.past_key_values, ref.past_key_values)


def _assert_same_cache(ours, theirs, mask=None):
    """Same cache type, layer types, shapes and states; with `mask`, states at padding
    positions are not compared (no query attends them; above layer 0 they depend on how
    many key slots a fully masked padding query spreads its weight over)."""
    assert type(ours) is type(theirs) and len(ours.layers) == len(theirs.layers)
    for a, b in zip(ours.layers, theirs.layers):
        assert type(a) is type(b)
        ka, va, kb, vb = a.keys, a.values, b.keys, b.values
        if mask is not None:
            # A sliding layer stores only its last positions.
            n = a.get_seq_length()
            full = torch.ones(mask.shape[0], n, dtype=torch.bool)
            full[:, :mask.shape[1]] = mask.bool()
            keep = full[:, n - ka.shape[2]:, None][:, None]
            ka, va, kb, vb = (t.masked_fill(~keep, 0) for t in (ka, va, kb, vb))
        _assert_same_structure((ka, va), (kb, vb), "cache")


def test_continue_from_returned_cache(model):
    ids, mask = left_padded([6, 4], 4, vocab=V)
    kw = dict(max_new_tokens=4, return_dict_in_generate=True, **GREEDY)
    ref = model.generate(ids, attention_mask=mask, **kw)
    out = generate(model, ids, attention_mask=mask, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    _assert_same_cache(out.past_key_values, ref.past_key_values, mask)
    more = torch.randint(3, V, (2, 3), generator=torch.Generator().manual_seed(5))
    new_ids = torch.cat([ref.sequences, more], dim=1)
    new_mask = torch.cat([mask, torch.ones(2, new_ids.shape[1] - mask.shape[1],
                                           dtype=mask.dtype)], dim=1)
    kw = dict(attention_mask=new_mask, max_new_tokens=6, **GREEDY)
    cont_ref = model.generate(new_ids, past_key_values=ref.past_key_values, **kw)
    cont = generate(model, new_ids, past_key_values=out.past_key_values, **kw)
    assert torch.equal(cont, cont_ref)
    assert torch.equal(cont, model.generate(new_ids, **kw))  # and equal to no cache at all


def test_continue_from_static_caches():
    model = _model("llama", seed=1)
    ids, mask = left_padded([6, 4], 6, vocab=V)
    for make in (lambda: StaticKVCache(model.config, 2, 40),
                 lambda: StaticCache(config=model.config, max_cache_len=40)):
        ours, theirs = make(), make()
        kw = dict(attention_mask=mask, max_new_tokens=4, **GREEDY)
        first = generate(model, ids, past_key_values=ours, **kw)
        assert torch.equal(first, model.generate(ids, past_key_values=theirs, **kw))
        assert ours.get_seq_length() == theirs.get_seq_length() == first.shape[1] - 1
        new_ids = torch.cat([first, torch.full((2, 2), 9)], dim=1)
        new_mask = torch.cat([mask, torch.ones(2, 6, dtype=mask.dtype)], dim=1)
        kw = dict(attention_mask=new_mask, max_new_tokens=5, **GREEDY)
        assert torch.equal(generate(model, new_ids, past_key_values=ours, **kw),
                           model.generate(new_ids, past_key_values=theirs, **kw))


def test_use_cache_false_recomputes(some_model):
    model = some_model
    ids, mask = left_padded([5, 2], 7, vocab=V)
    kw = dict(attention_mask=mask, max_new_tokens=6, use_cache=False, **GREEDY)
    ref = model.generate(ids, return_dict_in_generate=True, output_attentions=True, **kw)
    out = generate(model, ids, return_dict_in_generate=True, output_attentions=True, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.past_key_values is None and ref.past_key_values is None
    _assert_same_structure(out.attentions, ref.attentions, "attentions")


def test_eos_list_and_num_return_sequences(some_model):
    model = some_model
    ids, mask = left_padded([5, 3], 8, vocab=V)
    L = ids.shape[1]
    free = model.generate(ids, attention_mask=mask, max_new_tokens=8, **GREEDY)
    eos = [int(free[0, L + 2]), int(free[1, L + 4])]
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=eos,
              pad_token_id=0)
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=True, num_return_sequences=3)
    out = generate(model, ids, seed=3, **kw)
    assert out.shape == model.generate(ids, **kw).shape == (6, L + 5)
    assert torch.equal(out[:, :L], ids.repeat_interleave(3, dim=0))


def test_positional_generation_config_through_patch():
    model = _model("gpt2", seed=2)
    ids, mask = left_padded([4, 4], 9, vocab=V)
    config = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, config, attention_mask=mask)
    patch(model)
    assert torch.equal(model.generate(ids, config, attention_mask=mask), ref)
    # positional order: inputs, generation_config, logits_processor, stopping_criteria
    banned = int(ref[0, -1])
    ban = lp.LogitsProcessorList([lp.NoBadWordsLogitsProcessor([[banned]], eos_token_id=2)])
    out = model.generate(ids, config, ban, None, attention_mask=mask)
    assert banned not in out[0, 4:].tolist()


@pytest.mark.parametrize("extra", ["position_ids", "token_type_ids", "logits_to_keep",
                                   "remove_invalid_values"])
def test_model_inputs_match_hf(extra):
    model = _model("gpt2", seed=3)
    ids, mask = left_padded([6, 4], 10, vocab=V)
    kw = dict(attention_mask=mask, max_new_tokens=6, **GREEDY)
    if extra == "position_ids":
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0) + 5
    elif extra == "token_type_ids":
        g = torch.Generator().manual_seed(0)
        kw["token_type_ids"] = torch.randint(0, 3, ids.shape, generator=g)
    elif extra == "logits_to_keep":
        kw["logits_to_keep"] = 0
    else:
        # Model logits with NaN (mixed-sign products) and +-inf at tokens 7 and 9.
        model = _model("llama", seed=3)
        with torch.no_grad():
            model.lm_head.weight[7] = float("inf")
            model.lm_head.weight[9, :16] = float("inf")
        kw["remove_invalid_values"] = True
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out, ref)
    if extra != "logits_to_keep":  # the argument changes the tokens
        assert not torch.equal(out, model.generate(ids, attention_mask=mask, max_new_tokens=6,
                                                   **GREEDY))


def _gpt_neo_local():
    config = AutoConfig.for_model(
        "gpt_neo", vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, window_size=4,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "eager"
    return config


def test_gpt_neo_local_attention():
    config = _gpt_neo_local()
    model = seeded_random_model(lambda: AutoModelForCausalLM.from_config(config), 0, std=0.2)
    ids, mask = left_padded([7, 4], 11, vocab=V)
    kw = dict(attention_mask=mask, max_new_tokens=10, **GREEDY)
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))
