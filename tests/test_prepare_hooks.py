"""Models whose own generation hooks the decode loop cannot follow, and padding rows' hidden
states (found by fuzzing generate() against model.generate): a prepare hook that drops the
cache at a length (Phi-3 LongRoPE), hooks that feed other tokens or drop the positions, forwards
without a cache; those are refused (a patched model falls back to transformers)."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, OpenAIGPTConfig, OpenAIGPTLMHeadModel
from transformers import Phi3Config, Phi3ForCausalLM, XLMConfig, XLMWithLMHeadModel
from transformers.models.kosmos2.configuration_kosmos2 import Kosmos2TextConfig
from transformers.models.kosmos2.modeling_kosmos2 import Kosmos2TextForCausalLM

from gpu_sampler.hf import generate
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.tiny import seeded_random_model

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, vocab_size=100)
IDS = torch.tensor([[0, 0, 38, 32, 58, 4], [49, 31, 39, 85, 58, 70]])
MASK = (IDS != 0).long()


def _phi3():
    cfg = Phi3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     original_max_position_embeddings=8, **SPECIAL,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                      "short_factor": [1.0] * 4, "long_factor": [4., 5., 6., 7.],
                                      "original_max_position_embeddings": 8})
    return seeded_random_model(lambda: Phi3ForCausalLM(cfg), 0, std=0.3)


def test_longrope_crossing_refused_and_short_runs_match():
    model = _phi3()
    kw = dict(input_ids=IDS[1:], attention_mask=MASK[1:], do_sample=False)
    with pytest.raises(Unsupported):
        generate(model, max_new_tokens=8, **kw)  # 6 + 7 fed > 8: transformers re-prefills
    for beams in (1, 2):
        assert torch.equal(generate(model, max_new_tokens=3, num_beams=beams, **kw),
                           model.generate(max_new_tokens=3, num_beams=beams, **kw))


@pytest.mark.parametrize("beams", [1, 2])
def test_padding_rows_hidden_states_match(beams):
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, **SPECIAL)
    cfg._attn_implementation = "eager"
    model = seeded_random_model(lambda: LlamaForCausalLM(cfg), 0, std=0.1)
    kw = dict(input_ids=IDS, attention_mask=MASK, max_new_tokens=3, do_sample=False,
              num_beams=beams, return_dict_in_generate=True, output_hidden_states=True)
    want, got = model.generate(**kw), generate(model, **kw)
    for w_step, g_step in zip(want.hidden_states, got.hidden_states):
        for w, g in zip(w_step, g_step):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda: Kosmos2TextForCausalLM(Kosmos2TextConfig(embed_dim=32, layers=2, attention_heads=4,
                                                     ffn_dim=64, max_position_embeddings=64,
                                                     **SPECIAL)),
    lambda: XLMWithLMHeadModel(XLMConfig(emb_dim=32, n_layers=2, n_heads=4, causal=True,
                                         max_position_embeddings=64, **SPECIAL)),
    lambda: OpenAIGPTLMHeadModel(OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                 **SPECIAL)),
], ids=["kosmos2_text", "xlm", "openai_gpt"])
def test_models_the_loop_cannot_feed_refused(make):
    model = seeded_random_model(make, 0, std=0.08)
    with pytest.raises(Unsupported):
        generate(model, input_ids=IDS, attention_mask=MASK, max_new_tokens=3, do_sample=False)
