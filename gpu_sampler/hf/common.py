"""Pieces that transformers' decode loops here share: generate() and beam search."""
import torch
from transformers.generation import logits_process as lp

# Pure -inf masks: they commute with the repetition penalty and the log-softmax shift (a
# masked -inf stays -inf), so they can run in torch before a fused step.
MASKS = (lp.NoRepeatNGramLogitsProcessor, lp.NoBadWordsLogitsProcessor,
         lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor)


def is_in(obj, items):
    """Identity membership (processors define no useful ==)."""
    return any(obj is x for x in items)


def prompt_history_mask(mask, width):
    """bool [B, width]: the positions before each row's first attended prompt token (left
    padding), which the repetition penalty ignores like transformers' prompt_ignore_length."""
    first = (mask != 0).int().argmax(dim=1)
    return torch.arange(width, device=mask.device)[None, :] < first[:, None]
