"""generate() on encoder-decoder models (gpu_sampler/hf/seq2seq.py) against model.generate.

Tiny random T5, BART and Marian models built from their configs (no hub): greedy is
token-identical to transformers (right-padded encoder batch as their tokenizers pad, decoder
prompts, eos mid-way, penalties, num_return_sequences, the cache kinds), return_dict outputs
are compared field by field, sampling is reproducible with a seed and draws the first token
from transformers' processed distribution.
"""
import copy
import warnings

import pytest
import torch
from transformers import (AutoModelForSeq2SeqLM, BartConfig, GenerationConfig, MarianConfig,
                          T5Config)

import gpu_sampler
from gpu_sampler.hf import seq2seq
from gpu_sampler.hf.cache import StaticKVCache
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.hf.generation import generate
from gpu_sampler.tiny import seeded_random_model
from tests.chisq import assert_drawn_from

V = 120
ARCHS = ("t5", "bart", "marian")


def tiny_seq2seq(arch, seed=0, attn="sdpa"):
    """A random encoder-decoder model; ids 0 / 1 / 2 are pad / bos / eos."""
    common = dict(vocab_size=V, pad_token_id=0, eos_token_id=2)
    if arch == "t5":
        cfg = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                       relative_attention_num_buckets=8, dropout_rate=0.0,
                       decoder_start_token_id=0, **common)
    else:
        cls = BartConfig if arch == "bart" else MarianConfig
        cfg = cls(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  max_position_embeddings=128, dropout=0.0, forced_eos_token_id=None,
                  decoder_start_token_id=2 if arch == "bart" else 0, bos_token_id=1, **common)
    cfg._attn_implementation = attn
    model = seeded_random_model(lambda: AutoModelForSeq2SeqLM.from_config(cfg), seed, std=0.2)
    model.generation_config = GenerationConfig(
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=cfg.decoder_start_token_id)
    return model


def _batch(seed, lengths=(6, 3, 5)):
    """Encoder ids right-padded (as T5 / BART tokenizers pad) with their attention mask."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(3, V, (n,), generator=g)
        mask[b, :n] = 1
    return ids, mask


def assert_same(a, b, path="out"):
    """Outputs equal field by field (tensors within float tolerance); `path` names the field."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape, (path, a.shape, b.shape)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=path)
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def assert_same_cache(a, b):
    """Two EncoderDecoderCaches hold the same keys and values, layer by layer."""
    assert type(a) is type(b), (type(a), type(b))
    for part in ("self_attention_cache", "cross_attention_cache"):
        la, lb = getattr(a, part).layers, getattr(b, part).layers
        assert len(la) == len(lb), part
        for i, (x, y) in enumerate(zip(la, lb)):
            assert_same(x.keys, y.keys, f"{part}[{i}].keys")
            assert_same(x.values, y.values, f"{part}[{i}].values")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kw", [
    dict(),
    dict(repetition_penalty=2.0),
    dict(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=4),
    dict(use_cache=False, repetition_penalty=2.0),
    dict(cache_implementation="static", repetition_penalty=2.0),
], ids=["plain", "penalty", "ngram-min", "no-cache", "static"])
def test_greedy_matches_transformers(arch, kw):
    model = tiny_seq2seq(arch, seed=1)
    ids, mask = _batch(1)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, **kw)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=10, do_sample=False, **kw)
    assert torch.equal(out, ref)
    assert len({tuple(r) for r in ref[:, 1:].tolist()}) > 1  # the rows differ


def test_greedy_runs_on_our_static_cache_and_grows_it(monkeypatch):
    model = tiny_seq2seq("t5", seed=2)
    ids, mask = _batch(2, (4, 2))
    writes = []
    real = StaticKVCache.update
    monkeypatch.setattr(StaticKVCache, "update",
                        lambda self, k, v, i, *a, **kw: writes.append(i) or real(self, k, v, i,
                                                                                  *a, **kw))
    kw = dict(max_new_tokens=300, min_new_tokens=300, repetition_penalty=1.3, do_sample=False)
    out = generate(model, ids, attention_mask=mask, **kw)
    assert len(writes) == 2 * 300  # 2 decoder layers x (prompt + 299 fed tokens)
    monkeypatch.undo()
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))


@pytest.mark.parametrize("arch", ("t5", "bart"))
def test_decoder_prompt_and_mask_match_transformers(arch):
    model = tiny_seq2seq(arch, seed=3)
    ids, mask = _batch(3)
    # Left-padded decoder prompts without the start token: transformers prepends it.
    dec = torch.tensor([[3, 7, 8], [9, 10, 11], [3, 3, 12]])
    dec_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    for extra in (dict(decoder_input_ids=dec),
                  dict(decoder_input_ids=dec, decoder_attention_mask=dec_mask)):
        kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False,
                  repetition_penalty=1.4, **extra)
        ref = model.generate(ids, **kw)
        out = generate(model, ids, **kw)
        assert ref.shape[1] == 4 + 8
        assert torch.equal(out, ref)


def test_encoder_inputs_embeds_outputs_and_streamer_match_transformers():
    from tests.models import Recorder as Record

    model = tiny_seq2seq("bart", seed=13)
    ids, mask = _batch(13)
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, repetition_penalty=1.5,
              forced_eos_token_id=2)
    ref = model.generate(ids, **kw)
    ours, theirs = Record(), Record()
    assert torch.equal(generate(model, ids, streamer=ours, **kw),
                       model.generate(ids, streamer=theirs, **kw))
    assert len(ours.calls) == len(theirs.calls)
    assert all(x == y if isinstance(x, str) else torch.equal(x, y)
               for x, y in zip(ours.calls, theirs.calls))
    embeds = model.get_input_embeddings()(ids)
    assert torch.equal(generate(model, inputs_embeds=embeds, **kw), ref)
    enc = model.get_encoder()(input_ids=ids, attention_mask=mask)
    assert torch.equal(generate(model, encoder_outputs=enc, **kw), ref)


def test_missing_attention_mask_is_not_inferred_like_transformers():
    model = tiny_seq2seq("bart", seed=4)
    ids, _ = _batch(4)
    kw = dict(max_new_tokens=6, do_sample=False, repetition_penalty=1.5)
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))


@pytest.mark.parametrize("arch", ("t5", "bart"))
def test_eos_mid_way_pads_finished_rows(arch):
    model = tiny_seq2seq(arch, seed=5)
    ids, mask = _batch(5)
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, repetition_penalty=2.0)
    free = model.generate(ids, eos_token_id=None, **kw)
    eos = int(free[0, 4])  # a token row 0 emits mid-way
    ref = model.generate(ids, eos_token_id=eos, pad_token_id=0, **kw)
    out = generate(model, ids, eos_token_id=eos, pad_token_id=0, **kw)
    assert torch.equal(out, ref)
    assert (ref == eos).any() and ref.shape[1] <= free.shape[1]


def test_user_stopping_criteria_and_processors_match_transformers():
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 50

    class Ban(torch.nn.Module):
        def forward(self, input_ids, scores):
            return scores.index_fill(1, torch.tensor([109, 47]), float("-inf"))

    model = tiny_seq2seq("t5", seed=6)
    ids, mask = _batch(6)
    kw = dict(attention_mask=mask, max_new_tokens=9, do_sample=False, repetition_penalty=1.5,
              logits_processor=LogitsProcessorList([Ban()]),
              stopping_criteria=StoppingCriteriaList([StopAt()]))
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))


@pytest.mark.parametrize("arch", ("t5", "bart"))
@pytest.mark.parametrize("attn", (False, True))
def test_return_dict_outputs_field_by_field(arch, attn):
    model = tiny_seq2seq(arch, seed=7, attn="eager" if attn else "sdpa")
    ids, mask = _batch(7)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, repetition_penalty=1.7,
              return_dict_in_generate=True, output_scores=True, output_logits=True,
              output_attentions=attn, output_hidden_states=True, eos_token_id=None)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert type(out) is type(ref)
    for field in ("sequences", "scores", "logits", "encoder_attentions",
                  "encoder_hidden_states", "decoder_attentions", "cross_attentions",
                  "decoder_hidden_states"):
        a, b = getattr(out, field), getattr(ref, field)
        assert (a is None) == (b is None), field
        if b is not None:
            assert_same(a, b, field)
    if attn:
        assert len(ref.decoder_attentions) == 6 and ref.cross_attentions[0][0].shape[-1] == 6
    assert_same_cache(out.cache, ref.cache)


def test_return_dict_with_eos_trims_like_transformers():
    model = tiny_seq2seq("bart", seed=8)
    ids, mask = _batch(8)
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, repetition_penalty=2.0)
    eos = int(model.generate(ids, eos_token_id=None, **kw)[1, 3])
    kw.update(eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True,
              output_scores=True)
    ref, out = model.generate(ids, **kw), generate(model, ids, **kw)
    assert_same(out.sequences, ref.sequences)
    assert_same(out.scores, ref.scores)
    assert_same_cache(out.cache, ref.cache)


def test_num_return_sequences_and_seed():
    model = tiny_seq2seq("t5", seed=9)
    ids, mask = _batch(9, (5, 3))
    kw = dict(max_new_tokens=8, do_sample=True, temperature=1.3, top_k=40, top_p=0.95,
              num_return_sequences=3)
    a = generate(model, ids, attention_mask=mask, seed=11, **kw)
    b = generate(model, ids, attention_mask=mask, seed=11, **kw)
    ref = model.generate(ids, attention_mask=mask, **kw)
    assert a.shape == ref.shape == (6, 9)
    assert torch.equal(a, b)
    assert len({tuple(r) for r in a[:3, 1:].tolist()}) > 1
    # Batch independence: the second prompt alone, seeded as its rows were, draws the same.
    alone = generate(model, ids[1:], attention_mask=mask[1:], seed=torch.arange(14, 17), **kw)
    assert torch.equal(alone, a[3:])


def test_first_token_distribution_matches_transformers():
    model = tiny_seq2seq("bart", seed=10)
    ids, mask = _batch(10, (5, 3))
    kw = dict(do_sample=True, repetition_penalty=1.2, temperature=1.5, top_k=50, top_p=0.95)
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=1,
                        return_dict_in_generate=True, output_scores=True, **kw)
    probs = torch.softmax(hf.scores[0], dim=-1)
    n = 3000
    torch.manual_seed(1234)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=1, num_return_sequences=n,
                   **kw)
    first = out[:, -1].view(2, n)
    for b in range(2):
        assert_drawn_from(first[b], probs[b])


def test_patched_generate_runs_without_fallback_and_refusals_fall_back():
    model = tiny_seq2seq("t5", seed=11)
    ids, mask = _batch(11)
    greedy = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
    beams = dict(greedy, num_beams=2)
    refused = dict(beams, encoder_repetition_penalty=1.5)
    refs = [model.generate(ids, **kw) for kw in (greedy, beams, refused)]
    gpu_sampler.patch(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert torch.equal(model.generate(ids, **greedy), refs[0])
        assert torch.equal(model.generate(ids, **beams), refs[1])
    assert not [w for w in record if "gpu_sampler" in str(w.message)]
    with pytest.warns(UserWarning, match="encoder_repetition_penalty"):
        assert torch.equal(model.generate(ids, **refused), refs[2])
    with pytest.raises(Unsupported):
        generate(model, ids, **refused)


@pytest.mark.parametrize("kw", [dict(), dict(num_beams=2, repetition_penalty=1.5)],
                         ids=["greedy", "beams"])
def test_input_features_encoder_matches_transformers(kw):
    """An encoder whose main input is not input_ids (Speech2Text's input_features, with the
    frames' attention mask): the encoder runs through transformers' helper, the loop as ever."""
    from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration

    cfg = Speech2TextConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        input_feat_per_channel=8, conv_channels=16, max_source_positions=64,
        max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=2, dropout=0.0)
    model = seeded_random_model(lambda: Speech2TextForConditionalGeneration(cfg), 18, std=0.2)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                               decoder_start_token_id=2)
    feats = torch.randn(2, 40, 8, generator=torch.Generator().manual_seed(18))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 30:] = 0
    kw = dict(kw, attention_mask=mask, max_new_tokens=8, do_sample=False)
    ref = model.generate(feats, **kw)
    assert torch.equal(generate(model, feats, **kw), ref)
    assert torch.equal(generate(model, input_features=feats, **kw), ref)


def test_refusals_come_before_the_encoder_runs():
    model = tiny_seq2seq("bart", seed=12)
    ids, mask = _batch(12)
    calls = []
    model.get_encoder().register_forward_hook(lambda *a: calls.append(1))
    for kw in (dict(num_beams=2, cache_implementation="static"),
               dict(encoder_repetition_penalty=1.5), dict(compile=True),
               dict(penalty_alpha=0.5, top_k=4)):
        with pytest.raises(Unsupported):
            generate(model, ids, attention_mask=mask, max_new_tokens=3, **kw)
    assert not calls
    assert seq2seq.supports(model)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kw", [
    dict(num_beams=2),
    dict(num_beams=3, num_return_sequences=2, repetition_penalty=1.5, length_penalty=0.7),
    dict(num_beams=2, early_stopping=True, no_repeat_ngram_size=2, min_new_tokens=3),
], ids=["beams2", "beams3-nrs2-penalty", "early-ngram"])
def test_beam_search_matches_transformers(arch, kw):
    model = tiny_seq2seq(arch, seed=14)
    ids, mask = _batch(14)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **kw)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **kw)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("use_cache", (True, False))
def test_beam_search_decoder_prompt_and_eos_match_transformers(use_cache):
    model = tiny_seq2seq("bart", seed=15)
    ids, mask = _batch(15)
    dec = torch.tensor([[3, 7, 8], [9, 10, 11], [3, 3, 12]])
    dec_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, num_beams=2,
              repetition_penalty=1.4, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
              use_cache=use_cache)
    eos = int(model.generate(ids, eos_token_id=None, **kw)[0, 6])
    for e in (None, eos):
        ref = model.generate(ids, eos_token_id=e, pad_token_id=0, **kw)
        assert torch.equal(generate(model, ids, eos_token_id=e, pad_token_id=0, **kw), ref)


@pytest.mark.parametrize("arch", ("t5", "bart"))
def test_beam_search_return_dict_field_by_field(arch):
    model = tiny_seq2seq(arch, seed=16, attn="eager")
    ids, mask = _batch(16)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=2,
              repetition_penalty=1.3, return_dict_in_generate=True, output_scores=True,
              output_logits=True, output_attentions=True, output_hidden_states=True)
    ref, out = model.generate(ids, **kw), generate(model, ids, **kw)
    assert type(out) is type(ref)
    for field in ("sequences", "sequences_scores", "scores", "logits", "beam_indices",
                  "encoder_attentions", "encoder_hidden_states", "decoder_attentions",
                  "cross_attentions", "decoder_hidden_states"):
        a, b = getattr(out, field), getattr(ref, field)
        assert (a is None) == (b is None), field
        if b is not None:
            assert_same(a, b, field)


@pytest.mark.parametrize("arch", ("t5", "bart"))
def test_beam_search_without_cache_matches_transformers(arch):
    """num_beams > 1 with use_cache=False: the whole decoder sequence every step (transformers'
    per-step attentions / hidden states span it), no cache returned."""
    model = tiny_seq2seq(arch, seed=19, attn="eager")
    ids, mask = _batch(19)
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, num_beams=2,
              repetition_penalty=1.3, use_cache=False, return_dict_in_generate=True,
              output_scores=True, output_logits=True, output_attentions=True,
              output_hidden_states=True)
    ref, out = model.generate(ids, **kw), generate(model, ids, **kw)
    assert type(out) is type(ref) and out.past_key_values is None and ref.past_key_values is None
    for field in ("sequences", "sequences_scores", "scores", "logits", "beam_indices",
                  "decoder_attentions", "cross_attentions", "decoder_hidden_states"):
        assert_same(getattr(out, field), getattr(ref, field), field)
    assert out.decoder_hidden_states[-1][0].shape[1] > 1  # the whole sequence was fed


def test_beam_sampling_with_and_without_cache_draws_alike_under_patch():
    """transformers' own T5 test (create_and_check_generate_with_past_key_values): beam
    sampling with and without a cache, same torch seed, same tokens. Both calls must run one
    loop: a refused use_cache=False call ran transformers' random stream, the other ours."""
    model = tiny_seq2seq("t5", seed=20)
    ids, _ = _batch(20)
    gpu_sampler.patch(model, fallback=False)
    kw = dict(num_beams=2, max_length=5, do_sample=True)
    torch.manual_seed(0)
    without = model.generate(ids[:1], use_cache=False, **kw)
    torch.manual_seed(0)
    assert torch.equal(model.generate(ids[:1], **kw), without)


def test_beam_sampling_is_reproducible_with_a_seed():
    model = tiny_seq2seq("t5", seed=17)
    ids, mask = _batch(17)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=True, num_beams=2,
              temperature=3.0, num_return_sequences=2)
    a, b = generate(model, ids, seed=5, **kw), generate(model, ids, seed=5, **kw)
    assert torch.equal(a, b) and a.shape == model.generate(ids, **kw).shape


# A passed EncoderDecoderCache (issue 19): transformers' test_generate_continue_from_past_key_values
# continues a first call from its returned cache, decoder_input_ids holding its sequences.
CONTINUE_FIELDS = ("sequences", "scores", "logits", "encoder_attentions", "encoder_hidden_states",
                   "decoder_attentions", "cross_attentions", "decoder_hidden_states")


def _first_call(model, ids, mask, **kw):
    """The call a continuation starts from: its sequences and the cache it returns."""
    kw = dict(dict(max_new_tokens=3, do_sample=False, eos_token_id=None), **kw)
    return model.generate(ids, attention_mask=mask, return_dict_in_generate=True, **kw)


def _continue_both(model, ids, mask, cache, **kw):
    """transformers' and our call on two copies of `cache`: each must return its own copy,
    written in place; (ref, out)."""
    mine, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
    ref = model.generate(ids, attention_mask=mask, cache=theirs, **kw)
    out = generate(model, ids, attention_mask=mask, cache=mine, **kw)
    if kw.get("return_dict_in_generate"):
        assert ref.cache is theirs and out.cache is mine
    assert_same_cache(mine, theirs)
    return ref, out


def _assert_same_fields(out, ref):
    assert type(out) is type(ref)
    for field in CONTINUE_FIELDS:
        a, b = getattr(out, field), getattr(ref, field)
        assert (a is None) == (b is None), field
        if b is not None:
            assert_same(a, b, field)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("how", ["full-mask", "no-mask", "new-tokens"])
def test_continue_from_passed_cache_matches_transformers(arch, how):
    """The three ways transformers' _prefill reads the call: a decoder mask as wide as the
    decoder ids (feed what the cache lacks), no mask (every decoder token is fed on top of the
    cache), the new token alone with a mask spanning the cache (fed on top of it)."""
    model = tiny_seq2seq(arch, seed=21, attn="eager")
    ids, mask = _batch(21)
    first = _first_call(model, ids, mask, repetition_penalty=1.5)
    seqs = first.sequences
    cont = {"full-mask": dict(decoder_input_ids=seqs, decoder_attention_mask=torch.ones_like(seqs)),
            "no-mask": dict(decoder_input_ids=seqs),
            "new-tokens": dict(decoder_input_ids=seqs[:, -1:],
                               decoder_attention_mask=torch.ones(3, 4, dtype=torch.long))}[how]
    kw = dict(cont, max_new_tokens=4, do_sample=False, repetition_penalty=1.5, eos_token_id=None,
              return_dict_in_generate=True, output_scores=True, output_logits=True,
              output_attentions=True, output_hidden_states=True)
    ref, out = _continue_both(model, ids, mask, first.cache, **kw)
    _assert_same_fields(out, ref)
    assert out.cache.get_seq_length() == {"full-mask": 7, "no-mask": 10, "new-tokens": 8}[how]
    if how == "full-mask":  # the continuation is the one call it splits
        whole = generate(model, ids, attention_mask=mask, max_new_tokens=7, do_sample=False,
                         repetition_penalty=1.5, eos_token_id=None)
        assert torch.equal(out.sequences, whole)
    # Without return_dict the cache is still written in place, as in transformers.
    plain = {k: v for k, v in kw.items() if not k.startswith(("return_", "output_"))}
    ref, out = _continue_both(model, ids, mask, first.cache, **plain)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("arch", ("t5", "bart"))
def test_continue_left_padded_decoder_prompts_matches_transformers(arch):
    model = tiny_seq2seq(arch, seed=22)
    ids, mask = _batch(22)
    dec = torch.tensor([[3, 7, 8], [9, 10, 11], [3, 3, 12]])
    dec_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    first = _first_call(model, ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                        repetition_penalty=1.4)
    seqs = first.sequences  # the start token prepended: 1 + 3 + 3 columns
    cont_mask = torch.cat([torch.ones(3, 1, dtype=torch.long), dec_mask,
                           torch.ones(3, 3, dtype=torch.long)], dim=1)
    kw = dict(decoder_input_ids=seqs, decoder_attention_mask=cont_mask, max_new_tokens=5,
              do_sample=False, repetition_penalty=1.4, eos_token_id=None,
              return_dict_in_generate=True, output_scores=True, output_hidden_states=True)
    ref, out = _continue_both(model, ids, mask, first.cache, **kw)
    _assert_same_fields(out, ref)
    whole = model.generate(ids, attention_mask=mask, decoder_input_ids=dec,
                           decoder_attention_mask=dec_mask, max_new_tokens=8, do_sample=False,
                           repetition_penalty=1.4, eos_token_id=None)
    assert torch.equal(out.sequences, whole)


def test_continue_with_eos_mid_way_matches_transformers():
    model = tiny_seq2seq("bart", seed=8)
    ids, mask = _batch(8)
    first = _first_call(model, ids, mask, repetition_penalty=2.0)
    kw = dict(decoder_input_ids=first.sequences,
              decoder_attention_mask=torch.ones_like(first.sequences), max_new_tokens=8,
              do_sample=False, repetition_penalty=2.0)
    ref, _ = _continue_both(model, ids, mask, first.cache, eos_token_id=None, **kw)
    eos = int(ref[0, 5])  # every row draws it after the first call's tokens
    ref, out = _continue_both(model, ids, mask, first.cache, eos_token_id=eos, pad_token_id=0,
                              return_dict_in_generate=True, output_scores=True, **kw)
    assert ref.sequences.shape[1] < 4 + 8  # every row stopped early: the cache stops there too
    _assert_same_fields(out, ref)


def test_continue_sampling_with_a_seed_is_reproducible_and_splits_the_seeded_call():
    """Row b draws from (seed + b, decoder position): a seeded continuation draws what the one
    seeded call it splits draws; num_return_sequences expands the decoder rows onto a cache that
    holds as many (transformers does not expand the cache)."""
    model = tiny_seq2seq("t5", seed=24)
    ids, mask = _batch(24, (5, 3))
    kw = dict(do_sample=True, temperature=1.3, top_k=40, repetition_penalty=1.2, eos_token_id=None)
    whole = generate(model, ids, attention_mask=mask, max_new_tokens=7, seed=5, **kw)
    first = generate(model, ids, attention_mask=mask, max_new_tokens=3, seed=5,
                     return_dict_in_generate=True, **kw)
    cont = dict(decoder_input_ids=first.sequences,
                decoder_attention_mask=torch.ones_like(first.sequences), max_new_tokens=4, **kw)
    outs = [generate(model, ids, attention_mask=mask, cache=copy.deepcopy(first.cache), seed=5,
                     **cont) for _ in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], whole)
    # num_return_sequences=2 over a cache of 2 x 2 rows (a greedy first call: equal pairs).
    pairs = _first_call(model, ids, mask, num_return_sequences=2, do_sample=True, top_k=1)
    cont.update(decoder_input_ids=pairs.sequences[::2],
                decoder_attention_mask=torch.ones_like(pairs.sequences[::2]),
                num_return_sequences=2)
    outs = [generate(model, ids, attention_mask=mask, cache=copy.deepcopy(pairs.cache), seed=7,
                     **cont) for _ in range(2)]
    ref = model.generate(ids, attention_mask=mask, cache=copy.deepcopy(pairs.cache), **cont)
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == ref.shape == (4, 8)
    assert torch.equal(outs[0][:, :4], pairs.sequences)


def test_passed_cache_runs_our_loop_under_patch_and_the_rest_falls_back():
    model = tiny_seq2seq("marian", seed=25)
    ids, mask = _batch(25)
    first = _first_call(model, ids, mask)
    seqs = first.sequences
    kw = dict(attention_mask=mask, decoder_input_ids=seqs,
              decoder_attention_mask=torch.ones_like(seqs), max_new_tokens=4, do_sample=False)
    ref = model.generate(ids, cache=copy.deepcopy(first.cache), **kw)
    gpu_sampler.patch(model, fallback=False)  # a refusal would raise
    mine = copy.deepcopy(first.cache)
    assert torch.equal(model.generate(ids, cache=mine, **kw), ref)
    assert mine.get_seq_length() == 7
    # What transformers does not run (or runs only as its forward allows) is still refused,
    # before the encoder runs: patch hands it to transformers.
    from transformers import DynamicCache
    calls = []
    model.get_encoder().register_forward_hook(lambda *a: calls.append(1))
    for extra in (dict(num_beams=2),  # a cache of 3 rows for 6 beam rows
                  dict(use_cache=False),
                  dict(num_return_sequences=2, do_sample=True),  # a cache of 3 rows for 6
                  dict(decoder_input_ids=seqs[:, :-1],  # nothing beyond the cache
                       decoder_attention_mask=torch.ones(3, 3, dtype=torch.long)),
                  dict(cache=DynamicCache())):
        with pytest.raises(Unsupported):
            generate(model, ids, **{**kw, "cache": copy.deepcopy(first.cache), **extra})
    with pytest.raises(ValueError, match="cache_implementation"):
        generate(model, ids, cache=copy.deepcopy(first.cache), cache_implementation="static",
                 **kw)
    assert not calls
    gpu_sampler.unpatch(model)


def _assert_same_beam_fields(out, ref):
    _assert_same_fields(out, ref)
    for field in ("sequences_scores", "beam_indices"):
        assert_same(getattr(out, field), getattr(ref, field), field)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("how", ["full-mask", "no-mask", "new-tokens"])
def test_beam_search_continue_from_passed_cache_matches_transformers(arch, how):
    """Beams on a passed cache run in transformers when the cache holds B x num_beams rows (an
    earlier beam call's): the rows are reordered in place after every step, the last included."""
    model = tiny_seq2seq(arch, seed=31, attn="eager")
    ids, mask = _batch(31)
    base = dict(num_beams=2, do_sample=False, eos_token_id=None, repetition_penalty=1.3)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3,
                           return_dict_in_generate=True, **base)
    seqs = first.sequences
    cont = {"full-mask": dict(decoder_input_ids=seqs, decoder_attention_mask=torch.ones_like(seqs)),
            "no-mask": dict(decoder_input_ids=seqs),
            "new-tokens": dict(decoder_input_ids=seqs[:, -1:],
                               decoder_attention_mask=torch.ones(3, 4, dtype=torch.long))}[how]
    kw = dict(base, max_new_tokens=4, **cont)
    ref, out = _continue_both(model, ids, mask, first.cache, **kw)
    assert torch.equal(out, ref)
    kw.update(num_return_sequences=2, return_dict_in_generate=True, output_scores=True,
              output_logits=True, output_attentions=True, output_hidden_states=True)
    ref, out = _continue_both(model, ids, mask, first.cache, **kw)
    _assert_same_beam_fields(out, ref)


@pytest.mark.parametrize("arch", ("t5", "bart"))
def test_beam_search_continue_left_padded_with_eos_matches_transformers(arch):
    model = tiny_seq2seq(arch, seed=32)
    ids, mask = _batch(32)
    dec = torch.tensor([[3, 7, 8], [9, 10, 11], [3, 3, 12]])
    dec_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    base = dict(num_beams=3, do_sample=False, repetition_penalty=1.4, length_penalty=0.8)
    first = model.generate(ids, attention_mask=mask, decoder_input_ids=dec,
                           decoder_attention_mask=dec_mask,
                           max_new_tokens=3, eos_token_id=None, return_dict_in_generate=True,
                           **base)
    cont_mask = torch.cat([torch.ones(3, 1, dtype=torch.long), dec_mask,
                           torch.ones(3, 3, dtype=torch.long)], dim=1)
    kw = dict(base, decoder_input_ids=first.sequences, decoder_attention_mask=cont_mask,
              max_new_tokens=6)
    ref, _ = _continue_both(model, ids, mask, first.cache, eos_token_id=None, **kw)
    eos = int(ref[0, 9])
    ref, out = _continue_both(model, ids, mask, first.cache, eos_token_id=eos, pad_token_id=0,
                              return_dict_in_generate=True, output_scores=True, **kw)
    assert (ref.sequences[:, 7:] == eos).any()
    _assert_same_beam_fields(out, ref)


def test_beam_sampling_continue_from_passed_cache_is_reproducible_with_a_seed():
    model = tiny_seq2seq("bart", seed=33)
    ids, mask = _batch(33)
    base = dict(attention_mask=mask, num_beams=2, eos_token_id=None)
    first = model.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                           **base)
    kw = dict(base, decoder_input_ids=first.sequences,
              decoder_attention_mask=torch.ones_like(first.sequences), max_new_tokens=5,
              do_sample=True, temperature=1.5, seed=3)
    outs = [generate(model, ids, cache=copy.deepcopy(first.cache), **kw) for _ in range(2)]
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == (3, 9)
    assert torch.equal(outs[0][:, :4], first.sequences)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_continue_penalty_skips_what_the_mask_pads_like_transformers(num_beams):
    """A decoder mask spanning the cache (the new tokens alone passed, one of them the start
    token so nothing is prepended): transformers' prompt_ignore_length is the mask's left
    padding counted in sequence columns, so the repetition penalty skips generated tokens too."""
    model = tiny_seq2seq("bart", seed=41)  # decoder start token 2
    ids, mask = _batch(41)
    dec = torch.tensor([[0, 0, 0, 0, 2, 7], [2, 9, 10, 11, 12, 13], [0, 0, 0, 2, 8, 5]])
    dec_mask = (torch.arange(6) >= torch.tensor([[4], [0], [3]])).long()
    first = model.generate(ids, attention_mask=mask, decoder_input_ids=dec,
                           decoder_attention_mask=dec_mask, max_new_tokens=2,
                           num_beams=num_beams, do_sample=False, eos_token_id=None,
                           return_dict_in_generate=True)
    new = first.sequences[:, -1:].clone()
    new[1, 0] = 2
    kw = dict(decoder_input_ids=new, max_new_tokens=6, num_beams=num_beams, do_sample=False,
              decoder_attention_mask=torch.cat([dec_mask, torch.ones(3, 2, dtype=torch.long)], 1),
              eos_token_id=None, repetition_penalty=3.0, return_dict_in_generate=True,
              output_scores=True)
    ref, out = _continue_both(model, ids, mask, first.cache, **kw)
    _assert_same_fields(out, ref)
    if num_beams == 1:
        assert ref.sequences[0, :4].unique().numel() == 1  # a repeat the penalty did not see


def test_labels_among_the_inputs_are_not_forwarded():
    # As transformers: `labels` passed to generate reach no forward (no refusal, same tokens).
    model = tiny_seq2seq("t5", seed=3)
    ids, mask = _batch(3)
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, labels=ids)
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))


@pytest.mark.parametrize("config_eos", [True, False], ids=["config-eos", "no-config-eos"])
def test_user_eos_criteria_replaces_the_config_eos(config_eos):
    """A user EosTokenCriteria takes the place of the one transformers builds from
    eos_token_id (its criteria merge): the decoder stops on the user's ids only, and pads
    after them (tests/test_generate_contract.py for decoder-only models)."""
    from transformers.generation import stopping_criteria as sc

    model = tiny_seq2seq("bart")
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    free = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)
    x, y = int(free[0, 2]), int(free[1, -2])
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0,
              eos_token_id=x if config_eos else None,
              stopping_criteria=sc.StoppingCriteriaList([sc.EosTokenCriteria(y)]))
    ref = model.generate(ids, **kw)
    assert torch.equal(generate(model, ids, **kw), ref)


def _tiny_led(seed=0):
    from transformers import LEDConfig
    cfg = LEDConfig(vocab_size=300, d_model=32, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                    decoder_ffn_dim=64, max_encoder_position_embeddings=256,
                    max_decoder_position_embeddings=256, attention_window=[8], pad_token_id=0,
                    bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    return seeded_random_model(lambda: AutoModelForSeq2SeqLM.from_config(cfg), seed, std=0.1).eval()


@pytest.mark.parametrize("kw", [dict(), dict(num_beams=3, num_return_sequences=2)])
def test_model_without_static_cache_support_runs_on_a_dynamic_cache(kw):
    # LED builds no causal mask for a one-token decoder step: on a static cache it would attend
    # the unwritten slots (transformers marks such models _can_compile_fullgraph = False).
    model = _tiny_led()
    ids = torch.randint(3, 300, (2, 5), generator=torch.Generator().manual_seed(0))
    args = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                return_dict_in_generate=True, output_scores=True, **kw)
    ref = model.generate(ids, **args)
    out = generate(model, ids, **args)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b)
