"""Encoder-decoder calls transformers runs (found by fuzzing generate() against model.generate):
a left-padded decoder prompt under return_dict_in_generate (its padded positions' hidden states
and cache entries followed our static cache's width), trust_remote_code= (transformers pops
it), a decoder_attention_mask of another width than decoder_input_ids (refused with
Unsupported: a patched model falls back)."""
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import gpu_sampler
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.hf.compat import cache_arg, output_field
from gpu_sampler.hf.generation import generate
from tests.test_seq2seq import _batch, assert_same, assert_same_cache, tiny_seq2seq


@pytest.mark.parametrize("arch,attn", [("t5", "sdpa"), ("bart", "eager")])
@pytest.mark.parametrize("num_beams", [1, 2])
def test_left_padded_decoder_prompt_outputs_and_cache_match_transformers(arch, attn, num_beams):
    model = tiny_seq2seq(arch, seed=41, attn=attn)
    ids, mask = _batch(41, (6, 3))
    start = model.generation_config.decoder_start_token_id
    dec = torch.tensor([[0, 0, 5, 6], [start, 7, 8, 9]])
    dec_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    kw = dict(attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
              max_new_tokens=3, do_sample=False, eos_token_id=None, num_beams=num_beams,
              return_dict_in_generate=True, output_hidden_states=True)
    ref, out = model.generate(ids, **kw), generate(model, ids, **kw)
    assert_same(out.sequences, ref.sequences, "sequences")
    assert_same(out.decoder_hidden_states, ref.decoder_hidden_states, "decoder_hidden_states")
    field = output_field(type(ref))  # `cache` from transformers 5.24 on
    assert_same_cache(getattr(out, field), getattr(ref, field))
    # Continued without a decoder mask, the padded positions are attended: same tokens.
    more = dict(attention_mask=mask, decoder_input_ids=ref.sequences, max_new_tokens=3,
                do_sample=False, eos_token_id=None, num_beams=num_beams)
    name = cache_arg(model)
    assert torch.equal(generate(model, ids, **{name: getattr(out, field)}, **more),
                       model.generate(ids, **{name: getattr(ref, field)}, **more))


def test_trust_remote_code_is_accepted_like_transformers():
    model = tiny_seq2seq("t5", seed=1)
    ids, mask = _batch(1)
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, trust_remote_code=True)
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=64)).eval()
    x = torch.tensor([[5, 6, 7]])
    kw = dict(max_new_tokens=3, do_sample=False, trust_remote_code=False)
    assert torch.equal(generate(lm, x, **kw), lm.generate(x, **kw))


@pytest.mark.parametrize("width", [2, 5])
def test_decoder_mask_of_another_width_falls_back_to_transformers(width):
    model = tiny_seq2seq("bart", seed=81)
    ids, mask = _batch(81, (6, 3))
    dec = torch.tensor([[2, 5, 6], [2, 7, 8]])
    kw = dict(attention_mask=mask, decoder_input_ids=dec, max_new_tokens=4, do_sample=False,
              decoder_attention_mask=torch.ones(2, width, dtype=torch.long))
    ref = model.generate(ids, **kw)
    with pytest.raises(Unsupported, match="another width"):
        generate(model, ids, **kw)
    gpu_sampler.patch(model)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert torch.equal(model.generate(ids, **kw), ref)


def test_decoder_mask_of_another_batch_is_still_a_value_error():
    model = tiny_seq2seq("t5", seed=81)
    ids, mask = _batch(81, (6, 3))
    with pytest.raises(ValueError, match="decoder_attention_mask has shape"):
        generate(model, ids, attention_mask=mask, decoder_input_ids=torch.tensor([[0, 5]] * 2),
                 decoder_attention_mask=torch.ones(3, 2, dtype=torch.long), max_new_tokens=2)
