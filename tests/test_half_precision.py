"""bf16 / fp16 models on the CPU: greedy and beam search bit for bit against model.generate.

torch's CPU attention in half precision rounds differently over a static cache's longer,
masked key span than over the written keys a DynamicCache returns (logits 1 ulp apart from
the prefill on, other tokens at near ties, other beams): our cache returns the written
positions only there (``common.exact_span``)."""
import pytest
import torch

from gpu_sampler.hf.generation import generate
from tests.models import tiny_model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_half_precision_logits_and_tokens_like_hf(dtype, num_beams):
    model = tiny_model("llama", seed=1, vocab_size=300).to(dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, num_beams=num_beams,
              return_dict_in_generate=True, output_logits=True, output_scores=True)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        assert torch.equal(a, b)
    assert len(out.logits) == len(ref.logits)


def test_half_precision_prompt_lookup_like_hf():
    model = tiny_model("llama", seed=1, vocab_size=300).to(torch.bfloat16)
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=3)
    assert torch.equal(generate(model, ids, **kw), model.generate(ids, **kw))
