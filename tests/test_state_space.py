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


def _recurrent_gemma():
    cfg = AutoConfig.for_model(
        "recurrent_gemma", vocab_size=300, hidden_size=32, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=3, lru_width=32,
        attention_window_size=8, conv1d_width=4,
        block_types=["recurrent", "recurrent", "attention"], head_dim=8, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(cfg), 0, std=0.1).eval()


def test_recurrent_gemma_continuation_like_transformers():
    """RecurrentGemma keeps recurrent state in the module, so two identical continuation calls
    differ (~3e-2 in transformers itself: the twenty-fourth session took that for a mask
    difference); from the same model state ours is transformers' bit for bit."""
    import copy
    kw = dict(max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
              output_logits=True)
    outs = []
    for gen in (lambda m, *a, **k: m.generate(*a, **k), generate):
        m = _recurrent_gemma()
        ids = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(0))
        first = m.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
        more = torch.cat([first.sequences, torch.tensor([[7, 8]])], 1)
        outs.append(gen(m, more, past_key_values=copy.deepcopy(first.cache), **kw))
    ref, out = outs
    assert torch.equal(out.sequences, ref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
