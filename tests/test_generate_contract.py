"""generate()'s contract where transformers' own rules decide (found by fuzzing generate() against
model.generate): a user EosTokenCriteria, processors after the last row has finished, beam
search's cache_implementation, both cache argument names."""
import warnings

import pytest
import torch
from transformers import DynamicCache, StaticCache
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc

from gpu_sampler.hf.compat import output_field
from gpu_sampler.hf.generation import generate
from tests.models import tiny_model

IDS = torch.tensor([[5, 6, 7], [8, 9, 10]])


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, vocab_size=40)


def _free_run(model, n=8):
    return model.generate(IDS, max_new_tokens=n, do_sample=False, eos_token_id=None)[:, 3:]


@pytest.mark.parametrize("config_eos", [True, False], ids=["config-eos", "no-config-eos"])
def test_user_eos_criteria_replaces_the_config_eos(model, config_eos):
    """transformers puts a user EosTokenCriteria in place of the one it builds from
    eos_token_id: generation stops on the user's ids only. The device test kept stopping on
    the config's ids too (shorter sequences, silently), and raised TypeError without them."""
    free = _free_run(model)
    x, y = int(free[0, 1]), int(free[1, 5])  # row 0 emits x early, row 1 emits y late
    assert x not in free[1, :6].tolist() and y not in free[0].tolist()
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0,
              eos_token_id=x if config_eos else None,
              stopping_criteria=sc.StoppingCriteriaList([sc.EosTokenCriteria(y)]))
    ref = model.generate(IDS, **kw)
    out = generate(model, IDS, **kw)
    assert torch.equal(out, ref)
    assert out.shape[1] == 3 + 8 and int(out[1, 3 + 5]) == y and int(out[1, -1]) == 0


class _Lengths(lp.LogitsProcessor):
    """Records the lengths it is called at."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append(input_ids.shape[1])
        return scores


def test_processors_never_see_steps_after_every_row_finished(model):
    """transformers stops at the first step after which every row has finished; the decode
    loop checked only every few steps and ran the torch-side processors on the steps between
    (a processor that raises on a finished sequence raised here only)."""
    first = _free_run(model, 1)[:, 0]
    kw = dict(max_new_tokens=10, do_sample=False, eos_token_id=first.tolist(), pad_token_id=0)
    seen = []
    for run in (model.generate, lambda ids, **k: generate(model, ids, **k)):
        rec = _Lengths()
        out = run(IDS, logits_processor=lp.LogitsProcessorList([rec]), **kw)
        seen.append((out, rec.seen))
    (ref, ref_seen), (out, out_seen) = seen
    assert torch.equal(out, ref) and out.shape[1] == 4
    assert out_seen == ref_seen == [3]


@pytest.mark.parametrize("attn", [False, True], ids=["plain", "attentions"])
def test_beam_search_honours_cache_implementation(attn):
    """Beam search under cache_implementation="static" runs on (and returns) transformers'
    StaticCache, so attention weights span the static length, as transformers' own."""
    m = tiny_model("llama", seed=3, vocab_size=40)
    if attn:
        m.config._attn_implementation = "eager"
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    kw = dict(attention_mask=mask, num_beams=3, max_new_tokens=4, do_sample=False,
              cache_implementation="static", return_dict_in_generate=True,
              output_attentions=attn)
    ref = m.generate(IDS, **kw)
    out = generate(m, IDS, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    for o in (out, ref):
        assert isinstance(getattr(o, output_field(type(o))), StaticCache)
    if attn:
        assert [[a.shape for a in step] for step in out.attentions] == \
               [[a.shape for a in step] for step in ref.attentions]


def test_both_cache_names_use_cache_with_a_warning(model):
    """transformers 5.24 takes both `past_key_values` and `cache`: it warns and uses `cache`."""
    kw = dict(max_new_tokens=4, do_sample=False)
    ref = model.generate(IDS[:1], past_key_values=DynamicCache(config=model.config),
                         cache=DynamicCache(config=model.config), **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate(model, IDS[:1], past_key_values=DynamicCache(config=model.config),
                       cache=DynamicCache(config=model.config), **kw)
    assert torch.equal(out, ref)
    assert any("cache" in str(w.message) for w in caught)


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=float("inf")), dict(repetition_penalty=float("inf"), num_beams=2),
    dict(repetition_penalty=1e39), dict(max_new_tokens=2.5),
    dict(max_new_tokens=None, max_length=6.5)],
    ids=["rep-inf", "rep-inf-beam", "rep-past-float32", "max-new-2.5", "max-length-6.5"])
def test_values_transformers_runs_that_sample_refuses(model, kw):
    """transformers runs repetition_penalty=inf (a logit below 0 becomes -inf, above 0 becomes
    0) and a fractional max_new_tokens (it stops once the length reaches it). sample()'s numeric
    policy refuses the first, so transformers' processor stays in torch; the loops sized their
    buffers with the second (ValueError and TypeError here: a patched model broke calls that
    ran)."""
    kw = dict(dict(max_new_tokens=5, do_sample=False), **kw)
    ref = model.generate(IDS, **kw)
    out = generate(model, IDS, **kw)
    assert torch.equal(out, ref)
    if "max_new_tokens" in kw and kw["max_new_tokens"] == 2.5:
        assert out.shape[1] == 3 + 3
