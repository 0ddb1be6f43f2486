"""generate()'s deprecated cache argument names (``past_key_values``, ``cache_params``) behave
as in transformers' generate: renamed to ``cache`` with transformers' FutureWarning."""
import copy
import inspect
import warnings

import pytest
import torch
from transformers import LlamaForCausalLM

from gpu_sampler.hf import generate, patch
from gpu_sampler.hf.compat import NEW
from tests.models import tiny_model

pytestmark = pytest.mark.skipif(
    "cache" not in inspect.signature(LlamaForCausalLM.forward).parameters,
    reason="transformers without the `cache` rename")


def _warnings(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in caught:  # others go on to the caller (pytest.warns)
        if not issubclass(w.category, FutureWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, [(w.category, str(w.message)) for w in caught
                 if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize("name", ["past_key_values", "cache_params", "cache"])
def test_continuing_from_a_cache_warns_and_decodes_like_transformers(name):
    model = tiny_model("llama", seed=1, vocab_size=300)
    ids = torch.tensor([[5, 6, 7, 8]])
    first = model.generate(ids, max_new_tokens=3, return_dict_in_generate=True)
    full = torch.cat([first.sequences, torch.tensor([[9, 10]])], 1)

    def cont(fn):
        # a copy each: both calls write to the cache
        return _warnings(fn, full, max_new_tokens=3, **{name: copy.deepcopy(getattr(first, NEW))})

    ref, ref_warn = cont(model.generate)
    out, out_warn = cont(lambda *a, **k: generate(model, *a, **k))
    assert torch.equal(out, ref)
    assert out_warn == ref_warn
    assert bool(ref_warn) == (name != "cache")


def test_a_patched_model_handing_the_call_over_warns_once():
    # prefill_chunk_size is refused after the cache names are read: the call runs
    # transformers' generate, which must not see the deprecated name a second time
    model = tiny_model("llama", seed=1, vocab_size=300)
    ids = torch.tensor([[5, 6, 7, 8]])
    first = model.generate(ids, max_new_tokens=3, return_dict_in_generate=True)
    full = torch.cat([first.sequences, torch.tensor([[9, 10]])], 1)

    def call(m):
        return _warnings(m.generate, full, max_new_tokens=3, prefill_chunk_size=2,
                         past_key_values=copy.deepcopy(getattr(first, NEW)))

    ref, ref_warn = call(model)
    patch(model)
    with pytest.warns(UserWarning, match="prefill_chunk_size"):
        out, out_warn = call(model)
    assert torch.equal(out, ref)
    assert out_warn == ref_warn and len(ref_warn) == 1
