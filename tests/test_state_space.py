"""State-space models (Mamba) whose prepare_inputs_for_generation drops the attention mask of
a decode step: gpu_sampler must not pass it either (Mamba's mixer multiplies the step's states
by the whole 2-D mask, which broadcasts a one-token step to the mask's length)."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from gpu_sampler.hf.generation import generate
from gpu_sampler.tiny import seeded_random_model


def tiny_mamba(model_type="mamba", seed=0):
    config = AutoConfig.for_model(model_type, vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                  state_size=8, expand=2, conv_kernel=4, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2)
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(config), seed,
                               std=0.1).eval()


def _prompts():
    ids = torch.randint(3, 300, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    return ids, mask


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba"])
@pytest.mark.parametrize("kw", [dict(), dict(num_beams=3, num_return_sequences=2)],
                         ids=["greedy", "beams"])
def test_decode_steps_get_no_attention_mask_like_transformers(model_type, kw):
    model = tiny_mamba(model_type)
    ids, mask = _prompts()
    args = dict(attention_mask=mask, max_new_tokens=6, do_sample=False,
                return_dict_in_generate=True, output_logits=True, **kw)
    ref = model.generate(ids, **args)
    out = generate(model, ids, **args)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b)
