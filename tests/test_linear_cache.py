"""A cache of linear-attention layers only (Mamba's DynamicCache) has no sequence length:
transformers' get_seq_length raises on it. Beam search starts on a fresh one; a filled one
passed back is refused (Unsupported), and a patched model hands that call to transformers."""
import copy
import warnings

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import gpu_sampler
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.hf.generation import generate
from gpu_sampler.tiny import seeded_random_model


def tiny_mamba(seed=0):
    config = AutoConfig.for_model("mamba2", vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                  state_size=8, expand=2, conv_kernel=4, num_heads=8, head_dim=8,
                                  n_groups=1, chunk_size=16, pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2)
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(config), seed,
                               std=0.1).eval()


def test_beam_search_on_a_linear_attention_cache_matches_transformers():
    model = tiny_mamba()
    ids = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(0))
    args = dict(max_new_tokens=5, num_beams=3, num_return_sequences=2, do_sample=False,
                return_dict_in_generate=True, output_scores=True)
    ref = model.generate(ids, **args)
    out = generate(model, ids, **args)
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores)


def test_filled_linear_attention_cache_refused_and_patched_model_falls_back():
    model = tiny_mamba()
    ids = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(0))
    first = model.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    cache = first.cache if hasattr(first, "cache") else first.past_key_values
    more = torch.cat([first.sequences, torch.tensor([[7, 8]])], dim=1)
    ref = model.generate(more, past_key_values=copy.deepcopy(cache), max_new_tokens=4,
                         do_sample=False)
    with pytest.raises(Unsupported):
        generate(model, more, past_key_values=copy.deepcopy(cache), max_new_tokens=4,
                 do_sample=False)
    gpu_sampler.patch(model)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = model.generate(more, past_key_values=copy.deepcopy(cache), max_new_tokens=4,
                             do_sample=False)
    assert torch.equal(out, ref)
