"""A user processor that subclasses one of transformers' -inf mask processors is not a mask
(found by fuzzing generate()'s processors against model.generate)."""
import pytest
import torch
from transformers.generation import logits_process as lp

from gpu_sampler.hf.generation import generate
from tests.models import tiny_model
from tests.test_seq2seq import _batch, tiny_seq2seq


class _Boost(lp.SuppressTokensLogitsProcessor):
    """SuppressTokens' token list, boosted by +2 instead of banned."""

    def __call__(self, input_ids, scores):
        ids = self.suppress_tokens.to(scores.device)
        return scores.index_add(1, ids, torch.full((scores.shape[0], len(ids)), 2.0))


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_user_subclass_of_a_mask_processor_runs_after_the_penalty(arch):
    """transformers applies the repetition penalty before user processors; the plan took any
    instance of a mask class for a -inf mask (which commutes with the penalty) and fused the
    penalty into sample(), after the user's processor: other scores, other tokens, silently."""
    if arch == "t5":
        model = tiny_seq2seq("t5", seed=3)
        ids, mask = _batch(3, lengths=(5, 3))
        boosted = [4, 5, 6, 7, 8, 9]
    else:
        model = tiny_model("llama", seed=3, vocab_size=40)
        ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
        mask = torch.ones_like(ids)
        boosted = [5, 6, 9]
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, repetition_penalty=2.0,
              return_dict_in_generate=True, output_scores=True,
              logits_processor=lp.LogitsProcessorList([_Boost(boosted)]))
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    for ours, theirs in zip(out.scores, ref.scores):
        torch.testing.assert_close(ours, theirs)
