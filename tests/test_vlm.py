"""Vision-language models: gpu_sampler.generate against transformers' model.generate on tiny
random models (tests/vlm_models.py) with image inputs, left-padded prompts."""
import copy
import warnings

import pytest
import torch
from transformers.generation.stopping_criteria import StoppingCriteria

from gpu_sampler.hf import step_inputs
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.hf.generation import generate
from gpu_sampler.hf.patch import patch, unpatch
from tests import vlm_models

FAMILIES = ("llava", "qwen2_vl", "qwen2_5_vl", "gemma3", "paligemma", "idefics3", "smolvlm")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model, inputs = getattr(vlm_models, request.param)()
    return model, inputs, request.param


def _same(a, b, path="output"):
    """Field by field: tensors equal (floats to 1e-5), tuples element by element."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape, (path, a.shape, b.shape)
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=path)
        else:
            assert torch.equal(a, b), path
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a is None and b is None, (path, type(a), type(b))


def _both(model, inputs, **kw):
    ref = model.generate(**inputs, **kw)
    return ref, generate(model, **inputs, **kw)


def test_greedy_matches_transformers(family):
    model, inputs, _ = family
    ref, out = _both(model, inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, ref)


def test_greedy_without_cache(family):
    model, inputs, _ = family
    ref, out = _both(model, inputs, max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(out, ref)


def test_return_dict_field_by_field(family):
    model, inputs, _ = family
    kw = dict(max_new_tokens=5, do_sample=False, return_dict_in_generate=True,
              output_scores=True, output_logits=True, output_hidden_states=True,
              repetition_penalty=1.2)
    ref, out = _both(model, inputs, **kw)
    for field in ("sequences", "scores", "logits", "hidden_states"):
        _same(getattr(out, field), getattr(ref, field), field)
    ref_a, out_a = _both(model, inputs, max_new_tokens=3, do_sample=False,
                         return_dict_in_generate=True, output_attentions=True)
    _same(out_a.attentions, ref_a.attentions, "attentions")
    _same(out_a.sequences, ref_a.sequences, "sequences")


class _StopAfter(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, -1] == self.token)


def test_stopping_criteria_and_eos(family):
    model, inputs, _ = family
    free = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    L = inputs["input_ids"].shape[1]
    stop_tok, eos_tok = int(free[0, L + 2]), int(free[1, L + 1])
    kw = dict(max_new_tokens=8, do_sample=False, eos_token_id=eos_tok, pad_token_id=0)
    ref = model.generate(**inputs, stopping_criteria=[_StopAfter(stop_tok)], **kw)
    out = generate(model, **inputs, stopping_criteria=[_StopAfter(stop_tok)], **kw)
    assert torch.equal(out, ref)
    assert out.shape[1] < free.shape[1]


@pytest.mark.parametrize("do_sample", [False, True])
def test_beam_search_matches_transformers(family, do_sample):
    model, inputs, _ = family
    kw = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2,
              return_dict_in_generate=True, output_scores=True)
    if do_sample:
        # Beam sampling draws differently: its argmax limit (tiny temperature) is beam search.
        kw.update(do_sample=True, temperature=1e-4, top_k=0)
        out = generate(model, **inputs, seed=3, **kw)
        ref = model.generate(**inputs, **dict(kw, do_sample=False, temperature=None))
        assert torch.equal(out.sequences, ref.sequences)
        return
    ref, out = _both(model, inputs, do_sample=False, **kw)
    for field in ("sequences", "sequences_scores", "beam_indices", "scores"):
        _same(getattr(out, field), getattr(ref, field), field)


def test_beam_search_without_cache(family):
    # Every forward gets the whole sequence, its positions and token types, and the image
    # inputs again, as transformers feeds them without a cache.
    model, inputs, _ = family
    kw = dict(max_new_tokens=4, num_beams=2, do_sample=False, use_cache=False,
              return_dict_in_generate=True, output_scores=True, output_hidden_states=True)
    ref, out = _both(model, inputs, **kw)
    for field in ("sequences", "sequences_scores", "beam_indices", "scores", "hidden_states"):
        _same(getattr(out, field), getattr(ref, field), field)
    assert out.past_key_values is None


def test_sampling_seed_reproducible(family):
    model, inputs, name = family
    kw = dict(max_new_tokens=6, do_sample=True, temperature=0.9, top_k=20,
              num_return_sequences=2)
    a = generate(model, **inputs, seed=11, **kw)
    b = generate(model, **inputs, seed=11, **kw)
    c = generate(model, **inputs, seed=12, **kw)
    assert torch.equal(a, b) and a.shape == (4, inputs["input_ids"].shape[1] + 6)
    assert not torch.equal(a, c)
    # Row b's draws depend on (its seed, its position) only: the first prompt alone, seeded
    # with the same row seeds, draws the same tokens.
    _, one = getattr(vlm_models, name)(lengths=inputs["input_ids"].shape[1:])
    solo = generate(model, **one, seed=torch.tensor([11, 12]), **kw)
    assert torch.equal(solo[:, -6:], a[:2, -6:])


def test_patched_generate_runs_ours(family):
    model, inputs, _ = family
    patch(model, fallback=False)
    try:
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    finally:
        unpatch(model)
    assert torch.equal(out, model.generate(**inputs, max_new_tokens=4, do_sample=False))


def test_patched_assistant_in_transformers_assisted_decoding(family):
    # transformers' assisted decoding calls the assistant's generate round after round on its
    # cache, with generation_config.is_assistant: that call's prefill drops the image inputs
    # (is_first_iteration=False). A patched assistant runs ours there and must do the same.
    model, inputs, name = family
    _, one = getattr(vlm_models, name)(lengths=(9,))  # transformers' assisted decoding: batch 1
    kw = dict(max_new_tokens=6, do_sample=False)
    greedy = model.generate(**one, **kw)
    assistant = patch(copy.deepcopy(model), fallback=False)
    assert torch.equal(model.generate(**one, assistant_model=assistant, **kw), greedy)


def test_labels_among_the_inputs_are_not_forwarded(family):
    # transformers' testers pass their input dict, labels included, straight to generate; its
    # prepare_inputs_for_generation never forwards labels (a loss over one position's logits).
    model, inputs, _ = family
    kw = dict(max_new_tokens=3, do_sample=False, labels=inputs["input_ids"])
    ref, out = _both(model, inputs, **kw)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_prefix_lm_without_token_types_attends_as_on_transformers_cache(num_beams):
    # PaliGemma's decoder is not causal by itself (is_causal False): on transformers' default
    # DynamicCache an unpadded prompt gets no mask (it attends both ways), on a static cache a
    # causal one. Without token types that changes the logits (1e-3): we run its cache then.
    model, inputs = vlm_models.paligemma(lengths=(9, 9))
    inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    kw = dict(max_new_tokens=3, do_sample=False, num_beams=num_beams,
              return_dict_in_generate=True, output_logits=True)
    ref, out = _both(model, inputs, **kw)
    _same(out.logits, ref.logits, "logits")
    _same(out.sequences, ref.sequences, "sequences")


def test_unverified_vision_model_is_refused(family, monkeypatch):
    model, inputs, _ = family
    monkeypatch.setattr(step_inputs, "VISION_MODEL_TYPES", frozenset())
    with pytest.raises(Unsupported):
        generate(model, **inputs, max_new_tokens=2)
    patch(model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    finally:
        unpatch(model)
    assert any("runs transformers' generate" in str(w.message) for w in caught)
    assert torch.equal(out, model.generate(**inputs, max_new_tokens=3, do_sample=False))


def test_step_rules_read_off_the_models_hooks():
    """The per-model rules come from transformers' own hooks: PaliGemma's 1-based positions
    and suffix token type, Gemma 3's prefill-only token types, Qwen2-VL's zeros for new
    mm_token_type_ids and its image inputs encoded before the prefill."""
    expected = {"paligemma": (1, {"token_type_ids": 1}, ("token_type_ids",)),
                "gemma3": (0, {"token_type_ids": None}, ()),
                "qwen2_vl": (0, {"mm_token_type_ids": 0}, ("mm_token_type_ids",)),
                "llava": (0, {}, ())}
    for name, (offset, fill, decode_typed) in expected.items():
        model, inputs = getattr(vlm_models, name)()
        step = step_inputs.split_inputs(model, inputs)
        assert (step.pos_offset, step.fill, step.decode_typed) == (offset, fill, decode_typed)
        assert "pixel_values" in step.prefill and not step.typed.keys() - set(fill)


def _video_inputs(kind):
    """Qwen2-VL / Qwen2.5-VL with a 1x4x4-patch video per row (4 merged video tokens) where the
    image fixtures hold their image."""
    model, inputs = vlm_models._qwen_vl(kind, 0, (9, 6))
    video = vlm_models.IMAGE - 1  # the builders' video_token_id
    ids = inputs["input_ids"].clone()
    ids[ids == vlm_models.IMAGE] = video
    g = torch.Generator().manual_seed(3)
    return model, dict(input_ids=ids, attention_mask=inputs["attention_mask"],
                       pixel_values_videos=torch.randn(2 * 16, 3 * 2 * 14 * 14, generator=g),
                       video_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]]),
                       mm_token_type_ids=(ids == video).to(torch.int32) * 2)


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_video_inputs_match_transformers(kind):
    model, inputs = _video_inputs(kind)
    ref, out = _both(model, inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, ref)
    other = dict(inputs, pixel_values_videos=-inputs["pixel_values_videos"])
    assert not torch.equal(model.generate(**other, max_new_tokens=8, do_sample=False), ref)
    ref, out = _both(model, inputs, max_new_tokens=6, do_sample=False, num_beams=2)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", ["llava", "qwen2_vl"])
def test_continued_cache_after_an_image(name):
    """A second turn on the cache of a first one (the image already in it, so no pixels
    passed again), as transformers continues it."""
    import copy
    model, inputs = getattr(vlm_models, name)()
    first = model.generate(**inputs, max_new_tokens=4, do_sample=False,
                           return_dict_in_generate=True)
    more = torch.randint(3, 100, (2, 3), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([first.sequences, more], 1)
    kw = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask",
                                                       "pixel_values")}
    if "mm_token_type_ids" in kw:
        kw["mm_token_type_ids"] = (ids == vlm_models.IMAGE).to(torch.int32)
    kw.update(input_ids=ids, max_new_tokens=5, do_sample=False,
              attention_mask=torch.cat([inputs["attention_mask"], torch.ones(2, 7).long()], 1))
    ref = model.generate(past_key_values=copy.deepcopy(first.past_key_values), **kw)
    assert torch.equal(generate(model, past_key_values=copy.deepcopy(first.past_key_values),
                                **kw), ref)
