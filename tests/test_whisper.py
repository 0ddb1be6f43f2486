"""patch(model) on Whisper: Whisper's own generate prepares the call, gpu_sampler's
encoder-decoder loop decodes (gpu_sampler/hf/patch.py, hf/whisper.py, hf/seq2seq.py).

A tiny random multilingual WhisperForConditionalGeneration built from its config (no hub):
its generation config carries the special tokens Whisper's generate reads (start of
transcript, four languages, the two tasks, no-timestamps, timestamps after it). The patched
model's tokens equal the unpatched model's for greedy, beam search, language / task forcing,
language detection, prompt_ids, timestamps and long-form input; return_dict outputs are
compared field by field; sampling draws the first token from transformers' distribution.
Copies of a patched Whisper (deepcopy, pickle, torch.save) are patched and bound to themselves.
"""
import json

import warnings

import pytest
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
from transformers.generation.utils import GenerationMixin

import gpu_sampler
from gpu_sampler.hf import seq2seq
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.tiny import seeded_random_model
from tests.chisq import assert_drawn_from
from tests.test_patch import COPIES
from tests.test_seq2seq import assert_same, assert_same_cache

V = 120
EOS, SOT, TRANSLATE, TRANSCRIBE, PREV, NO_TIMESTAMPS = 50, 51, 56, 57, 59, 61
LANGS = {"<|en|>": 52, "<|fr|>": 53, "<|de|>": 54, "<|es|>": 55}
FRAMES = 100  # 2 * max_source_positions: Whisper's 30 s window at this size


def tiny_whisper(seed=0):
    """Ids 0-49 text, 50 eos / pad, 51 start of transcript, 52-55 languages, 56 / 57
    translate / transcribe, 59 start of previous, 61 no-timestamps, 62-119 timestamps."""
    cfg = WhisperConfig(vocab_size=V, num_mel_bins=8, d_model=32, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=FRAMES // 2,
                        max_target_positions=64, pad_token_id=EOS, bos_token_id=EOS,
                        eos_token_id=EOS, decoder_start_token_id=SOT, suppress_tokens=None,
                        begin_suppress_tokens=None, dropout=0.0)
    cfg._attn_implementation = "sdpa"
    model = seeded_random_model(lambda: WhisperForConditionalGeneration(cfg), seed, std=0.2)
    model.generation_config = GenerationConfig(
        pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=SOT,
        max_length=64, suppress_tokens=[1, 2, 3, 58, 59, 60], begin_suppress_tokens=[9, EOS],
        no_timestamps_token_id=NO_TIMESTAMPS, prev_sot_token_id=PREV, is_multilingual=True,
        lang_to_id=dict(LANGS), task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE},
        max_initial_timestamp_index=10, alignment_heads=[[1, 0], [1, 2]])
    return model


def features(B, seed, frames=FRAMES):
    return torch.randn(B, 8, frames, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def ran(monkeypatch):
    """Outcomes of the inner calls that reached gpu_sampler's loop: True when it decoded."""
    calls, real = [], seq2seq.generate_delegated

    def spy(*args, **kwargs):
        calls.append(False)
        out = real(*args, **kwargs)
        calls[-1] = True
        return out
    monkeypatch.setattr(seq2seq, "generate_delegated", spy)
    return calls


def _patched_quietly(model, x, **kw):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = model.generate(x, **kw)
    assert not [w for w in record if "gpu_sampler" in str(w.message)]
    return out


def test_patch_puts_the_shim_before_generation_mixin_and_unpatch_restores():
    model, other = tiny_whisper(1), tiny_whisper(1)
    x = features(1, 1)
    with pytest.raises(NotImplementedError, match="overrides transformers' generate"):
        gpu_sampler.generate(model, x, max_new_tokens=2)
    gpu_sampler.patch(model)
    mro = type(model).__mro__
    assert mro[1] is WhisperForConditionalGeneration
    assert mro[mro.index(GenerationMixin) - 1].__name__ == "_Delegated"
    assert type(model).__name__ == "WhisperForConditionalGeneration"
    assert type(other) is WhisperForConditionalGeneration  # only the instance changed
    assert "generate" not in model.__dict__                 # Whisper's generate runs
    assert gpu_sampler.patch(model) is model and type(model).__mro__ == mro
    with pytest.raises(NotImplementedError):  # direct calls still refuse Whisper
        gpu_sampler.generate(model, x, max_new_tokens=2)
    gpu_sampler.unpatch(model)
    assert type(model) is WhisperForConditionalGeneration


@pytest.mark.parametrize("kw", [
    dict(language="fr"),
    dict(language="de", task="translate"),
    dict(),                                                  # language detection
    dict(language=["en", "es"], prompt_ids=torch.tensor([7, 8, 9])),
    dict(forced_decoder_ids=[[1, 55], [2, TRANSCRIBE], [3, NO_TIMESTAMPS]]),
    dict(language="fr", repetition_penalty=1.5, cache_implementation="static"),
    dict(language="en", return_timestamps=True),
], ids=["fr", "de-translate", "detect", "per-row-language-prompt", "forced-ids",
        "penalty-static", "timestamps"])
@pytest.mark.parametrize("num_beams", (1, 2))
def test_tokens_match_transformers(ran, kw, num_beams):
    model, x = tiny_whisper(1), features(2, 1)
    kw = dict(kw, max_new_tokens=8, num_beams=num_beams)
    # Old checkpoints force the prompt through the generation config, not an argument.
    model.generation_config.forced_decoder_ids = kw.pop("forced_decoder_ids", None)
    if num_beams > 1:  # the beam loop refuses cache implementations (patch falls back)
        kw.pop("cache_implementation", None)
    ref = model.generate(x, **kw)
    out = _patched_quietly(gpu_sampler.patch(model), x, **kw)
    assert torch.equal(out, ref)
    assert ran and all(ran)
    assert len({tuple(r) for r in ref.tolist()}) > 1  # the rows differ


@pytest.mark.parametrize("num_beams", (1, 2))
def test_return_dict_field_by_field(ran, num_beams):
    model, x = tiny_whisper(9), features(2, 9)
    kw = dict(language="fr", max_new_tokens=6, num_beams=num_beams, return_dict_in_generate=True,
              output_scores=True, output_logits=True)
    ref = model.generate(x, **kw)
    out = _patched_quietly(gpu_sampler.patch(model), x, **kw)
    # (The random model emits timestamp pairs: Whisper's generate decodes the rest of the
    # window in a second inner call, and returns that call's outputs.)
    assert type(out) is type(ref) and ran and all(ran)
    assert out.sequences.shape[0] == 2
    fields = ["sequences", "scores", "logits"] + (
        ["sequences_scores", "beam_indices"] if num_beams > 1 else [])
    for field in fields:
        assert_same(getattr(out, field), getattr(ref, field), field)
    if num_beams == 1:
        assert_same_cache(out.cache, ref.cache)


def test_token_timestamps_match_transformers(ran):
    # return_token_timestamps reads the cross attentions of the returned output.
    model, x = tiny_whisper(4), features(2, 4)
    kw = dict(language="fr", max_new_tokens=6, return_token_timestamps=True)
    ref = model.generate(x, **kw)
    out = _patched_quietly(gpu_sampler.patch(model), x, **kw)
    assert all(ran)
    assert_same(out["sequences"], ref["sequences"])
    assert_same(out["token_timestamps"], ref["token_timestamps"])


@pytest.mark.parametrize("num_beams,use_cache", [(1, True), (2, True), (2, False)],
                         ids=["greedy", "beams", "beams-no-cache"])
def test_long_form_conditioned_on_previous_segments_matches_transformers(
        monkeypatch, ran, num_beams, use_cache):
    """Several inner calls per input; later ones start from the previous segments, left-padded
    with a decoder_attention_mask, where Whisper's positions count attended tokens (without a
    cache, over the whole decoder sequence each step)."""
    model, x = tiny_whisper(2), features(2, 2, frames=3 * FRAMES)
    mask = torch.ones(2, 3 * FRAMES, dtype=torch.long)
    mask[1, 190:] = 0
    kw = dict(language="fr", max_new_tokens=10, attention_mask=mask, return_timestamps=True,
              condition_on_prev_tokens=True, num_beams=num_beams, use_cache=use_cache)
    ref = model.generate(x, **kw)
    padded, real = [], seq2seq.decoder_positions
    monkeypatch.setattr(seq2seq, "decoder_positions",
                        lambda m, n: padded.append(bool((m == 0).any())) or real(m, n))
    out = _patched_quietly(gpu_sampler.patch(model), x, **kw)
    assert torch.equal(out, ref)
    assert len(ran) > 1 and all(ran)
    # Greedy: the rule mattered (left-padded prompts). Beams on a cache take the loop's
    # positions; without one the rule runs over the whole sequence each step.
    assert any(padded) if num_beams == 1 else bool(padded) != use_cache


def test_temperature_fallback_rounds_match_transformers(ran):
    """Whisper retries a window whose average log-probability (from the returned scores) or
    compression ratio misses its threshold; greedy retries (temperature 0.0) keep the rounds
    deterministic, so every retry runs in our loop and the tokens stay transformers'."""
    model, x = tiny_whisper(1), features(2, 1, frames=2 * FRAMES)
    mask = torch.ones(2, 2 * FRAMES, dtype=torch.long)
    kw = dict(language="fr", max_new_tokens=8, attention_mask=mask, return_timestamps=True,
              temperature=(0.0, 0.0), logprob_threshold=0.0, compression_ratio_threshold=1.2)
    ref = model.generate(x, **kw)
    out = _patched_quietly(gpu_sampler.patch(model), x, **kw)
    assert torch.equal(out, ref)
    assert len(ran) >= 4 and all(ran)  # >= 2 windows, each decoded twice


def test_sampling_draws_the_first_token_from_transformers_distribution(ran):
    model, x = tiny_whisper(5), features(2, 5)
    # Whisper's generate samples when `temperature` > 0 (it sets do_sample from it; the config
    # is validated before, with num_return_sequences, hence do_sample too).
    kw = dict(language="fr", do_sample=True, temperature=1.0, top_k=30, top_p=0.95)
    hf = model.generate(x, max_new_tokens=1, return_dict_in_generate=True, output_scores=True,
                        **kw)
    probs = torch.softmax(hf.scores[0], dim=-1)
    n = 2000
    with torch.random.fork_rng(devices=[]):  # a fixed seed here must not fix later tests'
        torch.manual_seed(0)
        out = _patched_quietly(gpu_sampler.patch(model), x, max_new_tokens=1,
                               num_return_sequences=n, **kw)
    assert ran == [True]
    first = out[:, 0].view(2, n)
    for b in range(2):
        assert_drawn_from(first[b], probs[b])
    # gpu_sampler's seed reaches the inner call through Whisper's generate.
    a, b = (model.generate(x, max_new_tokens=5, seed=7, **kw) for _ in range(2))
    assert torch.equal(a, b)


def test_unsupported_inner_call_falls_back_with_one_warning(ran):
    model, x = tiny_whisper(6), features(2, 6)
    kw = dict(language="fr", max_new_tokens=5,
              prefix_allowed_tokens_fn=lambda batch, ids: list(range(40)))
    ref = model.generate(x, **kw)
    gpu_sampler.patch(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        outs = [model.generate(x, **kw) for _ in range(2)]
    fallbacks = [w for w in record if "gpu_sampler" in str(w.message)]
    assert len(fallbacks) == 1 and "prefix_allowed_tokens_fn" in str(fallbacks[0].message)
    assert all(torch.equal(out, ref) for out in outs)
    assert ran == [False, False]
    gpu_sampler.patch(model, fallback=False)
    with pytest.raises(Unsupported, match="prefix_allowed_tokens_fn"):
        model.generate(x, **kw)


@pytest.fixture
def decoded(monkeypatch):
    """The models whose inner calls gpu_sampler's loop decoded, call by call."""
    models, real = [], seq2seq.generate_delegated

    def spy(model, *args, **kwargs):
        out = real(model, *args, **kwargs)
        models.append(model)
        return out
    monkeypatch.setattr(seq2seq, "generate_delegated", spy)
    return models


@pytest.mark.parametrize("how", COPIES)
def test_copies_of_a_patched_whisper_are_patched_and_bound_to_themselves(decoded, how):
    model, x = tiny_whisper(3), features(2, 3)
    kw = dict(language="fr", max_new_tokens=5)
    ref = model.generate(x, **kw)
    patched = type(gpu_sampler.patch(model, fallback=False))
    clone = COPIES[how](model)  # pickle finds the class by name: WhisperForConditionalGeneration
    assert type(clone) is patched and clone is not model
    state, original = clone.__dict__["_gpu_sampler_patch"], model.__dict__["_gpu_sampler_patch"]
    assert state == {"fallback": False, "warned": set()} and state is not original
    assert torch.equal(_patched_quietly(clone, x, **kw), ref)
    assert decoded and all(m is clone for m in decoded)
    n = len(decoded)
    assert torch.equal(_patched_quietly(model, x, **kw), ref)
    assert len(decoded) > n and all(m is model for m in decoded[n:])
    gpu_sampler.unpatch(clone)  # the copy only
    assert type(clone) is WhisperForConditionalGeneration and type(model) is patched
    n = len(decoded)
    assert torch.equal(clone.generate(x, **kw), ref) and len(decoded) == n


def test_save_pretrained_saves_whisper_which_loads_unpatched(decoded, tmp_path):
    model, x = tiny_whisper(3), features(2, 3)
    kw = dict(language="fr", max_new_tokens=5)
    ref = model.generate(x, **kw)
    gpu_sampler.patch(model).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "WhisperForConditionalGeneration"]
    loaded = WhisperForConditionalGeneration.from_pretrained(tmp_path)
    assert type(loaded) is WhisperForConditionalGeneration
    assert torch.equal(loaded.generate(x, **kw), ref) and not decoded
    # Loading through the patched model's class builds an instance of that class: patched,
    # with patch()'s defaults.
    again = type(model).from_pretrained(tmp_path)
    assert type(again) is type(model)
    assert torch.equal(_patched_quietly(again, x, **kw), ref) and decoded[-1] is again
