"""patch(model): a patched model.generate never breaks code that ran with transformers'.

What gpu_sampler.generate refuses (Unsupported) is handed to transformers' generate with one
warning per model and feature; fallback=False, or a call using gpu_sampler-only arguments,
raises instead. The fallback must be the very call the user made: same tokens, same outputs,
the streamer fed once. Copies of a patched model (deepcopy, pickle, torch.save) are patched and
bound to themselves; save_pretrained saves the model, which loads unpatched.
"""
import copy
import importlib
import io
import json
import pickle
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, T5Config, T5ForConditionalGeneration

import gpu_sampler
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.hf.generation import generate
from gpu_sampler.hf.patch import patch, unpatch
from tests.models import Recorder, tiny_model

patch_module = importlib.import_module("gpu_sampler.hf.patch")  # gpu_sampler.hf.patch: the function


def _prompts(seed, B=2, L=6, vocab=1000):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[0, :2] = 0  # left padding on one row
    return ids, mask


def _fallbacks(record):
    return [w for w in record if issubclass(w.category, UserWarning)
            and "gpu_sampler" in str(w.message)]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# Classifier-free guidance: transformers runs it, gpu_sampler refuses it.
GUIDED = dict(guidance_scale=1.5, max_new_tokens=4, do_sample=False,
              return_dict_in_generate=True, output_scores=True)


def _guided_inputs(model, seed):
    ids, mask = _prompts(seed)
    return dict(input_ids=ids, attention_mask=mask)


def test_unsupported_call_runs_transformers_generate_with_one_warning():
    model = tiny_model("llama", seed=31)
    inputs = _guided_inputs(model, 31)
    ref = model.generate(**inputs, **GUIDED)
    patch(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        outs = [model.generate(**_guided_inputs(model, 31), **GUIDED) for _ in range(2)]
    assert len(_fallbacks(record)) == 1  # once per model and feature
    assert "guidance_scale" in str(_fallbacks(record)[0].message)
    for out in outs:
        for field in ("sequences", "scores"):
            assert _same(getattr(out, field), getattr(ref, field)), field
    unpatch(model)


def test_direct_generate_and_fallback_false_raise():
    model = tiny_model("llama", seed=32)
    inputs = _guided_inputs(model, 32)
    with pytest.raises(NotImplementedError, match="guidance_scale"):
        generate(model, **inputs, **GUIDED)
    patch(model, fallback=False)
    with pytest.raises(Unsupported) as info:
        model.generate(**_guided_inputs(model, 32), **GUIDED)
    assert isinstance(info.value, NotImplementedError) and "guidance_scale" in str(info.value)
    patch(model)  # patching again only switches the fallback on
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.generate(**_guided_inputs(model, 32), **GUIDED)
    unpatch(model)
    assert "generate" not in model.__dict__


def test_gpu_sampler_only_arguments_are_never_handed_over():
    model = patch(tiny_model("llama", seed=33))
    with pytest.raises(Unsupported) as info:
        model.generate(**_guided_inputs(model, 33), seed=0, **GUIDED)
    assert "seed" in "".join(getattr(info.value, "__notes__", []))


def test_refusal_after_input_preparation_feeds_the_streamer_once():
    # encoder_repetition_penalty is refused while the processors are planned, after the inputs
    # are prepared: the streamer must see transformers' calls only, the prompt once.
    model = tiny_model("llama", seed=34)
    ids, mask = _prompts(34)
    kw = dict(max_new_tokens=5, do_sample=False, encoder_repetition_penalty=1.5)
    rec_hf, rec = Recorder(), Recorder()
    ref = model.generate(ids, attention_mask=mask, streamer=rec_hf, **kw)
    patch(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = model.generate(ids, attention_mask=mask, streamer=rec, **kw)
    assert len(_fallbacks(record)) == 1 and "encoder_repetition_penalty" in str(
        _fallbacks(record)[0].message)
    assert torch.equal(out, ref)
    assert len(rec.calls) == len(rec_hf.calls)
    assert all(_same(x, y) for x, y in zip(rec.calls, rec_hf.calls))


def test_encoder_decoder_model_runs_greedy_and_falls_back_for_refusals_token_identical():
    torch.manual_seed(35)
    cfg = T5Config(vocab_size=200, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg).eval()
    ids = torch.randint(2, 200, (2, 7), generator=torch.Generator().manual_seed(35))
    ref = model.generate(ids, max_new_tokens=6, do_sample=False)
    ref_beams = model.generate(ids, max_new_tokens=6, do_sample=False, num_beams=2,
                               cache_implementation="static")
    gpu_sampler.patch(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert not _fallbacks(record)
    assert torch.equal(out, ref)
    with pytest.warns(UserWarning, match="encoder-decoder"):
        out = model.generate(ids, max_new_tokens=6, do_sample=False, num_beams=2,
                             cache_implementation="static")
    assert torch.equal(out, ref_beams)


def test_beam_search_without_cache_runs_ours():
    """num_beams > 1 with use_cache=False: transformers feeds the whole sequence each step, so
    the per-step hidden states / attentions span it and no cache is returned; the beam loop
    does the same, so the patched model runs it instead of handing it over."""
    model = tiny_model("llama", seed=41)
    model.config._attn_implementation = "eager"
    ids, mask = _prompts(41)
    kw = dict(attention_mask=mask, max_new_tokens=3, num_beams=2, do_sample=False,
              use_cache=False, return_dict_in_generate=True, output_scores=True,
              output_hidden_states=True, output_attentions=True)
    ref = model.generate(ids, **kw)
    patch(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = model.generate(ids, **kw)
    assert not _fallbacks(record)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.past_key_values is None and ref.past_key_values is None
    for name in ("hidden_states", "attentions"):
        got, want = getattr(out, name), getattr(ref, name)
        assert [[t.shape for t in step] for step in got] == [[t.shape for t in step] for step in want]


def test_supported_calls_do_not_warn():
    model = patch(tiny_model("gpt2", seed=36))
    ids, mask = _prompts(36)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
        model.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=2, do_sample=False)
    assert not _fallbacks(record)


def _torch_roundtrip(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# The ways code copies a whole model (tests/test_whisper.py copies Whisper the same ways).
COPIES = {"deepcopy": copy.deepcopy, "pickle": lambda model: pickle.loads(pickle.dumps(model)),
          "torch.save": _torch_roundtrip}


@pytest.fixture
def ours(monkeypatch):
    """The models gpu_sampler's generate ran on, call by call (a patched generate calls it)."""
    models, real = [], patch_module.generate

    def spy(model, *args, **kwargs):
        models.append(model)
        return real(model, *args, **kwargs)
    monkeypatch.setattr(patch_module, "generate", spy)
    return models


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("arch", ("llama", "gpt2"))
def test_copies_of_a_patched_model_are_patched_and_bound_to_themselves(ours, arch, how):
    model = tiny_model(arch, seed=37)
    ids, mask = _prompts(37)
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    ref = model.generate(ids, **kw)
    patch(model, fallback=False)
    model.__dict__["_gpu_sampler_patch"]["warned"].add("num_beams")
    clone = COPIES[how](model)
    assert type(clone) is type(model) and clone is not model
    state, original = clone.__dict__["_gpu_sampler_patch"], model.__dict__["_gpu_sampler_patch"]
    assert state == {"fallback": False, "warned": {"num_beams"}}
    assert state is not original and state["warned"] is not original["warned"]
    assert torch.equal(clone.generate(ids, **kw), ref) and ours[-1] is clone
    assert torch.equal(model.generate(ids, **kw), ref) and ours[-1] is model
    unpatch(clone)  # the copy only
    assert "generate" not in clone.__dict__ and "_gpu_sampler_patch" not in clone.__dict__
    assert torch.equal(clone.generate(ids, **kw), ref) and len(ours) == 2
    assert torch.equal(model.generate(ids, **kw), ref) and len(ours) == 3 and ours[-1] is model


def test_save_pretrained_saves_the_model_which_loads_unpatched(tmp_path):
    model = tiny_model("llama", seed=38)
    ids, mask = _prompts(38)
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    ref = model.generate(ids, **kw)
    patch(model).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is type(model) and "generate" not in loaded.__dict__
    assert torch.equal(loaded.generate(ids, **kw), ref)


def test_patched_generate_reads_like_the_bound_method_it_replaces():
    """Code that reads model.generate's name, signature or function (logging, decorators made
    with functools.wraps, inspect.signature to filter arguments) reads the same after patch,
    on the model and on its copies."""
    import functools
    import inspect
    model = tiny_model("llama", seed=0)
    names = ("__name__", "__qualname__", "__func__")
    before = {name: getattr(model.generate, name) for name in names}
    signature = inspect.signature(model.generate)
    patch(model)
    for m in (model, copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert {name: getattr(m.generate, name) for name in names} == before
        assert inspect.signature(m.generate) == signature
        assert functools.wraps(m.generate)(lambda: None).__name__ == "generate"
        assert m.generate.__wrapped__.__self__ is m
        with pytest.raises(AttributeError):
            m.generate.no_such_attribute
