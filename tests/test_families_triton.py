"""Each model family generate() serves, with the step on the Triton kernels (the interpreter on
CPU; CUDA runs them by default): beam search token-identical to transformers, seeded sampling
identical to the torch twin's tokens (both draw from one counter-based RNG).

The other tests run these families on the torch twin (the CPU backend); this file is the
other backend, one small call per mode, kept short for the interpreter (decoder-only models on
the kernels: tests/test_beam.py, tests/test_kernel_edits.py). Greedy without penalties never
reaches a kernel (sample()'s all-greedy path is an argmax)."""
import warnings

import pytest
import torch

import gpu_sampler
from gpu_sampler import params
from gpu_sampler.hf.generation import generate
from tests import vlm_models
from tests.conftest import BACKENDS
from tests.test_seq2seq import _batch, tiny_seq2seq
from tests.test_whisper import features, tiny_whisper

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="needs triton (GPU or "
                                                                 "interpreter)")


def _seq2seq(arch):
    def build(seed):
        ids, mask = _batch(seed, lengths=(5, 3))
        return tiny_seq2seq(arch, seed=seed), dict(input_ids=ids, attention_mask=mask)
    return build


def _vlm(name):
    def build(seed):
        return getattr(vlm_models, name)(seed=seed)
    return build


FAMILIES = {"t5": _seq2seq("t5"), "bart": _seq2seq("bart"),
            "llava": _vlm("llava"), "qwen2_vl": _vlm("qwen2_vl"), "gemma3": _vlm("gemma3"),
            "paligemma": _vlm("paligemma"), "idefics3": _vlm("idefics3")}


def _on(monkeypatch, backend):
    """Every sampler call picks `backend`; returns the list its calls are counted in."""
    calls = []

    def pick(requested, logits):
        calls.append(backend)
        return backend
    monkeypatch.setattr(params, "pick_backend", pick)
    return calls


SAMPLED = dict(max_new_tokens=3, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_on_the_kernels(family, monkeypatch):
    model, inputs = FAMILIES[family](seed=2)
    beams = dict(max_new_tokens=3, do_sample=False, num_beams=2, num_return_sequences=2)
    ref_beams = model.generate(**inputs, **beams)
    _on(monkeypatch, "torch")
    twin = generate(model, **inputs, **SAMPLED)
    kernel_calls = _on(monkeypatch, "triton")
    assert torch.equal(generate(model, **inputs, **beams), ref_beams)
    assert torch.equal(generate(model, **inputs, **SAMPLED), twin)
    assert len(kernel_calls) >= 6  # each step of both calls


def test_whisper_on_the_kernels(monkeypatch):
    # Whisper's own generate under patch(model): its inner decoding loop runs on the kernels.
    model, x = tiny_whisper(1), features(2, 1)
    kw = dict(language="fr")
    ref_beams = model.generate(x, num_beams=2, max_new_tokens=3, **kw)
    gpu_sampler.patch(model)
    _on(monkeypatch, "torch")
    twin = model.generate(x, **kw, **SAMPLED)
    kernel_calls = _on(monkeypatch, "triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a fallback would warn
        assert torch.equal(model.generate(x, num_beams=2, max_new_tokens=3, **kw), ref_beams)
        assert torch.equal(model.generate(x, **kw, **SAMPLED), twin)
    assert len(kernel_calls) >= 6
