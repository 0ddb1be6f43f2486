"""gpu_sampler.generate against transformers' own model.generate()."""

import pytest
import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation import logits_process as lp

import gpu_sampler
from gpu_sampler.hf.cache import StaticKVCache
from gpu_sampler.hf.generation import generate
from gpu_sampler.hf.patch import patch, unpatch
from tests.chisq import assert_drawn_from
from tests.models import ARCHS, Recorder, left_padded, tiny_model, train_tokenizer

V = 1000


def _seed():
    return int(torch.randint(0, 2**31 - 1, (1,)))


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return tiny_model(request.param, seed=5)


GREEDY_CASES = {
    "plain": dict(),
    "rep1.3": dict(repetition_penalty=1.3),
    "min_new": dict(min_new_tokens=6),
    "ngram": dict(no_repeat_ngram_size=2),
    "bad_words": dict(bad_words_ids=[[7], [11, 12], [100, 101, 102]]),
}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_matches_hf(arch_model, case):
    ids, mask = left_padded([9, 5, 2], _seed())
    kw = dict(GREEDY_CASES[case], max_new_tokens=12, do_sample=False)
    ref = arch_model.generate(ids, attention_mask=mask, **kw)
    out = generate(arch_model, ids, attention_mask=mask, **kw)
    assert torch.equal(out, ref)


def test_greedy_eos_mid_way_and_eos_list(arch_model):
    ids, mask = left_padded([8, 3, 6], _seed())
    L = ids.shape[1]
    free = arch_model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False,
                               eos_token_id=V + 5)
    # One eos id per row taken from what greedy produces, so every row stops early.
    eos = [int(free[0, L + 3]), int(free[1, L + 5]), int(free[2, L + 1])]
    for e in (eos, eos[0]):
        ref = arch_model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False,
                                  eos_token_id=e, pad_token_id=0)
        out = generate(arch_model, ids, attention_mask=mask, max_new_tokens=14, do_sample=False,
                       eos_token_id=e, pad_token_id=0)
        assert torch.equal(out, ref)
        if e is eos:  # every row meets its own eos by step 5: the output is cut short
            assert out.shape[1] <= L + 6


def test_eos_shortens_output_with_padding():
    model = tiny_model("llama", seed=9)
    ids, mask = left_padded([4, 7, 5], _seed())
    L = ids.shape[1]
    free = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                          eos_token_id=V + 5)
    eos = [int(free[b, L + s]) for b, s in ((0, 2), (1, 6), (2, 4))]
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                         eos_token_id=eos, pad_token_id=0)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                   eos_token_id=eos, pad_token_id=0)
    assert ref.shape[1] <= L + 7
    assert torch.equal(out, ref)


class _BanMultiplesOf(lp.LogitsProcessor):
    def __init__(self, m):
        self.m = m

    def __call__(self, input_ids, scores):
        banned = torch.arange(scores.shape[1], device=scores.device) % self.m == 0
        return scores.masked_fill(banned, float("-inf"))


def test_user_logits_processor_with_repetition_penalty_matches_hf():
    model = tiny_model("qwen2", seed=2)
    ids, mask = left_padded([6, 3, 5], _seed())
    kw = dict(max_new_tokens=10, do_sample=False, repetition_penalty=1.3)
    ref = model.generate(ids, attention_mask=mask,
                         logits_processor=lp.LogitsProcessorList([_BanMultiplesOf(3)]), **kw)
    out = generate(model, ids, attention_mask=mask,
                   logits_processor=lp.LogitsProcessorList([_BanMultiplesOf(3)]), **kw)
    assert torch.equal(out, ref)
    new = out[:, ids.shape[1]:]
    # Rows that drew eos continue with pad 0 (a multiple of 3 the processor never let through).
    assert not bool(((new % 3 == 0) & (new != 0)).any())


def _hf_chain(first_attended, rp=1.2, T=0.7, k=50, p=0.9, min_p=None):
    chain = [lp.RepetitionPenaltyLogitsProcessor(rp, prompt_ignore_length=first_attended),
             lp.TemperatureLogitsWarper(T), lp.TopKLogitsWarper(k), lp.TopPLogitsWarper(p)]
    if min_p is not None:
        chain.append(lp.MinPLogitsWarper(min_p))
    return lp.LogitsProcessorList(chain)


@pytest.mark.parametrize("min_p", [None, 0.05])
def test_sampling_scores_equal_hf_processor_chain(min_p):
    model = tiny_model("llama", seed=4)
    ids, mask = left_padded([7, 4, 6], _seed())
    L = ids.shape[1]
    kw = dict(do_sample=True, repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9)
    if min_p is not None:
        kw["min_p"] = min_p
    # No eos: a row that drew it would continue with pad tokens outside the support.
    res = generate(model, ids, attention_mask=mask, max_new_tokens=8, return_dict_in_generate=True,
                   output_scores=True, output_logits=True, eos_token_id=V + 5, **kw)
    seq = res.sequences
    assert len(res.scores) == len(res.logits) == seq.shape[1] - L
    chain = _hf_chain((mask != 0).int().argmax(1), min_p=min_p)
    for i, (scores, raw) in enumerate(zip(res.scores, res.logits)):
        expected = chain(seq[:, :L + i], raw.clone())
        assert torch.equal(torch.isinf(scores), torch.isinf(expected)), i
        fin = torch.isfinite(expected)
        torch.testing.assert_close(scores[fin], expected[fin], atol=1e-5, rtol=0)
        # The drawn token is inside the support.
        assert bool(torch.isfinite(scores.gather(1, seq[:, L + i, None])).all())
    # Step 0's raw logits are transformers' own.
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=1, return_dict_in_generate=True,
                        output_scores=True, output_logits=True, **kw)
    torch.testing.assert_close(res.logits[0], hf.logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(res.scores[0], hf.scores[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("config", [
    dict(do_sample=True),                                   # top_k=50 by default
    dict(do_sample=True, top_k=None, top_p=0.8),
    dict(do_sample=True, top_k=0, temperature=1.3, min_p=0.1),
    dict(repetition_penalty=1.4, no_repeat_ngram_size=2),   # greedy scores
])
def test_step0_scores_match_hf_config_resolution(config):
    model = tiny_model("gpt2", seed=1)
    ids, mask = left_padded([5, 5], _seed())
    res = generate(model, ids, attention_mask=mask, max_new_tokens=1,
                   return_dict_in_generate=True, output_scores=True, **config)
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=1,
                        return_dict_in_generate=True, output_scores=True, **config)
    torch.testing.assert_close(res.scores[0], hf.scores[0], atol=1e-5, rtol=0)


def test_model_generation_config_sampling_defaults_apply():
    model = tiny_model("llama", seed=6)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                               do_sample=True, top_k=7, temperature=0.5)
    ids, mask = left_padded([4], _seed())
    res = generate(model, ids, max_new_tokens=3, return_dict_in_generate=True, output_scores=True)
    assert all(int(torch.isfinite(s).sum()) <= 7 for s in res.scores)
    hf = model.generate(ids, max_new_tokens=1, return_dict_in_generate=True, output_scores=True)
    torch.testing.assert_close(res.scores[0], hf.scores[0], atol=1e-5, rtol=0)


def test_first_token_distribution_matches_hf():
    model = tiny_model("llama", seed=8)
    ids, mask = left_padded([6, 3], _seed())
    kw = dict(do_sample=True, repetition_penalty=1.2, temperature=1.5, top_k=50, top_p=0.95)
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=1, return_dict_in_generate=True,
                        output_scores=True, **kw)
    probs = torch.softmax(hf.scores[0], dim=-1)  # exact target distribution per prompt
    n = 3000
    torch.manual_seed(1234)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=1, num_return_sequences=n,
                   **kw)
    first = out[:, -1].view(2, n)
    for b in range(2):
        assert_drawn_from(first[b], probs[b])


def test_num_return_sequences_expand_like_hf():
    model = tiny_model("mistral", seed=3)
    ids, mask = left_padded([5, 3], _seed())
    out = generate(model, ids, attention_mask=mask, max_new_tokens=6, do_sample=True,
                   num_return_sequences=3, seed=7)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True,
                         num_return_sequences=3)
    assert out.shape == ref.shape == (6, ids.shape[1] + 6)
    assert torch.equal(out[:, :ids.shape[1]], ids.repeat_interleave(3, dim=0))
    assert len({tuple(r) for r in out[:3, ids.shape[1]:].tolist()}) > 1


def test_seed_makes_rows_reproducible_and_batch_independent():
    model = tiny_model("llama", seed=7)
    ids, mask = left_padded([6, 4, 5], _seed())
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.9, top_p=0.95)
    a = generate(model, ids, attention_mask=mask, seed=11, **kw)
    b = generate(model, ids, attention_mask=mask, seed=11, **kw)
    assert torch.equal(a, b)
    # Row 2 alone with the seed it had in the batch (11 + 2): same tokens.
    c = generate(model, ids[2:, 1:], attention_mask=mask[2:, 1:], seed=torch.tensor([13]), **kw)
    assert torch.equal(c[:, -10:], a[2:, -10:])


def test_generator_reproducibility_with_manual_seed():
    model = tiny_model("gpt2", seed=7)
    ids, mask = left_padded([6, 4], _seed())
    torch.manual_seed(99)
    a = generate(model, ids, attention_mask=mask, max_new_tokens=8, do_sample=True)
    torch.manual_seed(99)
    b = generate(model, ids, attention_mask=mask, max_new_tokens=8, do_sample=True)
    assert torch.equal(a, b)


def test_presence_frequency_penalties_change_greedy_repeats():
    model = tiny_model("llama", seed=12)
    ids, mask = left_padded([3], _seed())
    plain = generate(model, ids, max_new_tokens=30, do_sample=False)
    pen = generate(model, ids, max_new_tokens=30, do_sample=False, presence_penalty=50.0)
    new = pen[0, ids.shape[1]:].tolist()
    assert len(set(new)) == len(new)  # a huge presence penalty forbids repeats
    assert plain.shape == pen.shape


def test_streamer_protocol_matches_hf():
    model = tiny_model("llama", seed=13)
    ids, mask = left_padded([5, 3], _seed())
    free = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    eos = [int(free[0, -5]), int(free[1, -6])]
    rec_hf, rec = Recorder(), Recorder()
    kw = dict(max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
    model.generate(ids, attention_mask=mask, streamer=rec_hf, **kw)
    generate(model, ids, attention_mask=mask, streamer=rec, **kw)
    assert len(rec.calls) == len(rec_hf.calls)
    for x, y in zip(rec.calls, rec_hf.calls):
        assert (x == y) if isinstance(x, str) else torch.equal(x, y)


def test_stop_strings_and_user_stopping_criteria_match_hf():
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

    tok = train_tokenizer(1000)
    model = tiny_model("llama", seed=14, vocab_size=len(tok))
    ids = tok(["hello world", "a tiny model"], return_tensors="pt", padding=True)
    L = ids.input_ids.shape[1]
    free = model.generate(**ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    stop = tok.decode(free[0, L + 4:L + 6])
    kw = dict(max_new_tokens=12, do_sample=False, stop_strings=[stop], tokenizer=tok)
    ref = model.generate(**ids, **kw)
    out = generate(model, ids.input_ids, attention_mask=ids.attention_mask, **kw)
    assert torch.equal(out, ref)

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= L + 3)

    kw = dict(max_new_tokens=12, do_sample=False, stopping_criteria=StoppingCriteriaList([
        StopAfter()]))
    ref = model.generate(**ids, **kw)
    out = generate(model, ids.input_ids, attention_mask=ids.attention_mask, **kw)
    assert torch.equal(out, ref) and out.shape[1] == L + 3


class _ScoresSpy:
    """A stopping criterion recording the `scores` argument it is called with."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores, **kwargs):
        self.seen.append(None if scores is None else tuple(s.clone() for s in scores))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@pytest.mark.parametrize("dict_scores", [True, False], ids=["output_scores", "plain"])
def test_stopping_criteria_get_transformers_scores_argument(dict_scores):
    """transformers calls the stopping criteria with the processed scores so far (a tuple of
    [B, V] per step) under return_dict_in_generate + output_scores, else with None; its own
    ConfidenceCriteria (which assisted decoding gives the assistant) reads `scores[-1][0]`."""
    from transformers.generation.stopping_criteria import ConfidenceCriteria

    model = tiny_model("llama", seed=40)
    ids, mask = left_padded([6, 3], 40)
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, repetition_penalty=1.3,
              return_dict_in_generate=dict_scores, output_scores=dict_scores)
    ref_spy, spy = _ScoresSpy(), _ScoresSpy()
    ref = model.generate(ids, stopping_criteria=[ref_spy], **kw)
    out = generate(model, ids, stopping_criteria=[spy], **kw)
    assert torch.equal(out.sequences if dict_scores else out, ref.sequences if dict_scores else ref)
    assert len(spy.seen) == len(ref_spy.seen)
    for got, want in zip(spy.seen, ref_spy.seen):
        assert (got is None) == (want is None)
        if want is not None:
            assert len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    if dict_scores:  # batch 1, as transformers' assistant runs it
        kw = dict(max_new_tokens=8, do_sample=False, return_dict_in_generate=True,
                  output_scores=True, stopping_criteria=[ConfidenceCriteria(0.5)])
        ref = model.generate(ids[1:, 3:], **kw)
        out = generate(model, ids[1:, 3:], **kw)
        assert torch.equal(out.sequences, ref.sequences)


def test_patch_unpatch(monkeypatch):
    model = tiny_model("gpt2", seed=15)
    ids, mask = left_padded([4, 2], _seed())
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    calls = []
    real = gpu_sampler.hf.generation.sample

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(gpu_sampler.hf.generation, "sample", spy)
    patch(model)
    patch(model)  # idempotent
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=5,
                                      do_sample=False), ref)
    assert len(calls) == 5
    unpatch(model)
    assert "generate" not in model.__dict__
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=5,
                                      do_sample=False), ref)
    assert len(calls) == 5


def test_generate_uses_static_cache_without_reallocation(monkeypatch):
    model = tiny_model("llama", seed=16)
    seen = []
    real_update = StaticKVCache.update

    def update(self, k, v, layer_idx, *a, **kw):
        K, _ = real_update(self, k, v, layer_idx, *a, **kw)
        if layer_idx == 0:
            seen.append((K.data_ptr(), K.shape))
        return K, _

    monkeypatch.setattr(StaticKVCache, "update", update)
    ids, mask = left_padded([5, 2, 4], _seed())
    res = generate(model, ids, attention_mask=mask, max_new_tokens=9, do_sample=False,
                   return_dict_in_generate=True)
    assert len(seen) == 9  # one prefill + 8 decode steps
    assert len({p for p, _ in seen}) == 1 and len({s for _, s in seen}) == 1
    # What transformers returns by default, holding every position but the last token's.
    assert type(res.past_key_values) is DynamicCache
    assert res.past_key_values.get_seq_length() == res.sequences.shape[1] - 1


def test_buffers_double_between_steps(monkeypatch):
    """A huge max_new_tokens allocates a bounded start and doubles it; tokens stay exact."""
    import gpu_sampler.hf.buffers as buffers

    model = tiny_model("gpt2", seed=19)
    monkeypatch.setattr(buffers, "_INITIAL_NEW_POSITIONS", 3)
    caps = []
    real_grow = buffers._grow_cache

    def grow(model, cache, B, length):
        caps.append(length)
        return real_grow(model, cache, B, length)

    monkeypatch.setattr(buffers, "_grow_cache", grow)
    ids, mask = left_padded([6, 2], _seed())
    L = ids.shape[1]
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False,
                         repetition_penalty=1.2, return_dict_in_generate=True)
    res = generate(model, ids, attention_mask=mask, max_new_tokens=40, do_sample=False,
                   repetition_penalty=1.2, return_dict_in_generate=True)
    assert torch.equal(res.sequences, ref.sequences)
    # Capacity L + 3, then doubled: 12, 24, then capped at the L + 39 positions fed.
    assert caps == [2 * (L + 3), 4 * (L + 3), L + 39]
    k_ref, k = ref.past_key_values.layers[0].keys, res.past_key_values.layers[0].keys
    assert k.shape == k_ref.shape
    torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(penalty_alpha=0.6, top_k=4), NotImplementedError, "penalty_alpha"),
    (dict(dola_layers="high"), NotImplementedError, "dola_layers"),
    (dict(guidance_scale=1.5), NotImplementedError, "guidance_scale"),
    (dict(prefix_allowed_tokens_fn=lambda b, x: [1]), NotImplementedError,
     "prefix_allowed_tokens_fn"),
    (dict(assistant_model="x"), ValueError, "assistant_model"),
    (dict(synced_gpus=True), NotImplementedError, "synced_gpus"),
    (dict(encoder_repetition_penalty=1.5), NotImplementedError, "encoder_repetition_penalty"),
    (dict(cache_implementation="paged"), NotImplementedError, "cache_implementation"),
    (dict(negative_prompt_ids=torch.ones(1, 2, dtype=torch.long)), NotImplementedError,
     "negative_prompt_ids"),
    (dict(custom_generate=lambda *a, **k: None), NotImplementedError, "custom_generate"),
    (dict(not_an_argument=3), ValueError, "not_an_argument"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=-2), ValueError, "max_new_tokens"),
    (dict(max_length=4, max_new_tokens=None), ValueError, "max_length"),
    (dict(num_return_sequences=2), ValueError, "num_return_sequences"),
    (dict(do_sample=True, temperature=0.0), ValueError, "temperature"),
    (dict(repetition_penalty=-1.0), ValueError, "penalty"),
    (dict(presence_penalty=float("nan")), ValueError, "presence_penalty"),
    (dict(seed="x", do_sample=True), ValueError, "seed"),
])
def test_bad_arguments_raise(kwargs, exc, match):
    model = tiny_model("llama")
    ids = torch.randint(3, V, (1, 6))
    kw = dict(max_new_tokens=3)
    kw.update(kwargs)
    kw = {k: v for k, v in kw.items() if v is not None or k != "max_new_tokens"}
    with pytest.raises(exc, match=match):
        generate(model, ids, **kw)


def test_empty_prompt_and_prompt_too_long():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="empty"):
        generate(model, torch.zeros(2, 0, dtype=torch.long), max_new_tokens=3)
    with pytest.raises(ValueError, match="max_length"):
        generate(model, torch.randint(3, V, (1, 10)), max_length=8)


def test_invalid_rows_raise():
    model = tiny_model("llama")

    class AllInf(lp.LogitsProcessor):
        def __call__(self, input_ids, scores):
            return torch.full_like(scores, float("-inf"))

    with pytest.raises(ValueError, match="no valid token"):
        generate(model, torch.randint(3, V, (2, 4)), max_new_tokens=3, do_sample=True,
                 logits_processor=lp.LogitsProcessorList([AllInf()]))


def test_compile_traces_like_eager(monkeypatch):
    """The compiled decode step is traced by dynamo and matches eager (cheap backend; the real
    inductor run is the next test)."""
    model = tiny_model("llama", seed=17)
    ids, mask = left_padded([5, 3], _seed())
    ref = generate(model, ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    real_compile = torch.compile
    used = []

    def eager_compile(fn, **kw):
        used.append(kw)
        return real_compile(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    torch._dynamo.reset()
    out = generate(model, ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                   compile=True)
    assert used and torch.equal(out, ref)


def test_compile_inductor_same_tokens_as_eager():
    """The real torch.compile (inductor on CPU): about 25-55 s of compilation, within budget."""
    model = tiny_model("llama", seed=18)
    ids, mask = left_padded([5, 3], _seed())
    ref = generate(model, ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                   compile=True)
    assert torch.equal(out, ref)
    kw = dict(max_new_tokens=12, do_sample=True, temperature=0.8, top_k=20, seed=3)
    assert torch.equal(generate(model, ids, attention_mask=mask, compile=True, **kw),
                       generate(model, ids, attention_mask=mask, **kw))


def test_huge_max_new_tokens_allocates_what_is_generated():
    """max_new_tokens=10**9 as "no limit": bounded buffers, stopped by a criterion."""
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

    model = tiny_model("llama", seed=20)
    ids, mask = left_padded([5, 3], _seed())
    L = ids.shape[1]

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= L + 6)

    kw = dict(attention_mask=mask, max_new_tokens=10**9, do_sample=False,
              stopping_criteria=StoppingCriteriaList([StopAt()]), return_dict_in_generate=True)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences) and out.sequences.shape[1] == L + 6


def test_too_small_static_cache_is_refused_before_any_write():
    model = tiny_model("llama", seed=21)
    ids = torch.randint(3, V, (1, 6))
    cache = StaticKVCache(model.config, 1, 8)
    with pytest.raises(ValueError, match="past_key_values"):
        generate(model, ids, past_key_values=cache, max_new_tokens=5)
    assert cache.get_seq_length() == 0


def test_compile_config_follows_transformers_auto_compile(monkeypatch):
    """compile_config is honoured where transformers would compile (a static cache on an
    accelerator, or CompileConfig._compile_all_devices); never for the default cache."""
    from transformers import CompileConfig

    model = tiny_model("llama", seed=22)
    ids, mask = left_padded([5, 3], _seed())
    ref = generate(model, ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    used = []

    def compiled_call(config):
        used.append(config)
        return model.__call__

    monkeypatch.setattr(model, "get_compiled_call", compiled_call)
    config = CompileConfig()
    config._compile_all_devices = True
    for impl in (None, "static"):
        out = generate(model, ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                       cache_implementation=impl, compile_config=config)
        assert torch.equal(out, ref)
    assert used == [config]


TORCH_SIDE_CASES = {
    "sequence_bias": dict(sequence_bias={(5,): 4.0, (7, 8): -3.0}),
    "suppress_tokens": dict(suppress_tokens=[5, 6, 7]),
    "begin_suppress_tokens": dict(begin_suppress_tokens=[5, 6]),
    "forced_bos": dict(forced_bos_token_id=4),
    "forced_eos": dict(forced_eos_token_id=3),
    "exp_decay": dict(exponential_decay_length_penalty=(2, 1.5), eos_token_id=3),
    "renormalize": dict(renormalize_logits=True, repetition_penalty=1.3),
    "typical": dict(do_sample=True, typical_p=0.6, temperature=0.8),
    "epsilon": dict(do_sample=True, epsilon_cutoff=3e-3, top_k=20),
    "eta": dict(do_sample=True, eta_cutoff=1e-3, top_p=0.9),
    "top_h": dict(do_sample=True, top_h=0.4),
}


def test_suppress_tokens_keep_the_fused_step(monkeypatch):
    # suppress_tokens / begin_suppress_tokens are -inf masks: they commute with the penalty,
    # so the repetition penalty and the warpers stay in sample() (not run in torch), and the
    # processed scores are still transformers'.
    model = tiny_model("llama", seed=29)
    ids, mask = left_padded([6, 3], _seed())
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=20, top_p=0.9,
              temperature=0.8, repetition_penalty=1.4, suppress_tokens=[5, 6, 7],
              begin_suppress_tokens=[8, 9], return_dict_in_generate=True, output_scores=True)
    seen = []
    real = gpu_sampler.hf.generation.sample

    def spy(*a, **k):
        seen.append(k)
        return real(*a, **k)

    monkeypatch.setattr(gpu_sampler.hf.generation, "sample", spy)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, seed=3, **kw)
    assert seen and all(k["repetition_penalty"] == 1.4 and k["top_k"] == 20 for k in seen)
    torch.testing.assert_close(out.scores[0], ref.scores[0], atol=1e-5, rtol=0)
    L = ids.shape[1]
    assert not bool(torch.isin(out.sequences[:, L:], torch.tensor([5, 6, 7])).any())
    assert not bool(torch.isin(out.sequences[:, L], torch.tensor([8, 9])).any())


@pytest.mark.parametrize("case", list(TORCH_SIDE_CASES))
def test_other_transformers_processors_match_hf(case):
    """Processors without a fused twin run as transformers' own, in transformers' order."""
    model = tiny_model("gpt2", seed=23)
    ids, mask = left_padded([5, 3], _seed())
    L = ids.shape[1]
    kw = dict(TORCH_SIDE_CASES[case], attention_mask=mask, max_new_tokens=6,
              return_dict_in_generate=True, output_scores=True, pad_token_id=0)
    kw.setdefault("eos_token_id", None)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, seed=1, **kw)
    if not kw.get("do_sample"):
        assert torch.equal(out.sequences, ref.sequences)
    for i, s in enumerate(out.scores):  # every drawn token is inside the processed support
        assert bool(torch.isfinite(s.gather(1, out.sequences[:, L + i, None])).all())
    torch.testing.assert_close(out.scores[0], ref.scores[0], atol=1e-5, rtol=0)


def test_signature_is_transformers():
    """Same parameters in the same order as GenerationMixin.generate (after the model)."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    ours = list(inspect.signature(generate).parameters)[1:]
    theirs = list(inspect.signature(GenerationMixin.generate).parameters)[1:]
    assert ours == theirs
