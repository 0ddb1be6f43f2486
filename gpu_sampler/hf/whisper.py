"""What gpu_sampler knows about Whisper (``WhisperForConditionalGeneration``), in one place.

Whisper's own ``generate`` (transformers' ``WhisperGenerationMixin``) prepares the call: the
decoder prompt (start of transcript, language, task, no-timestamps, ``prompt_ids``), language
detection, its logits processors, long-form segmentation and temperature fallback. It then hands
each decoding loop to ``GenerationMixin.generate`` through ``super().generate(...)``.
:func:`gpu_sampler.patch` keeps Whisper's ``generate`` and puts gpu_sampler's encoder-decoder
loop behind that ``super()`` call (:func:`delegates`); the loop reproduces the one hook Whisper
also overrides (:func:`reproduces_hook`, :func:`decoder_positions`).
"""
import torch
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin
from transformers.models.whisper.modeling_whisper import WhisperForConditionalGeneration

__all__ = ["delegates", "reproduces_hook", "positions_follow_mask", "decoder_positions"]


def delegates(model):
    """Whether ``model``'s own generate runs its decoding loops through ``super().generate``,
    so that patch() replaces that inner call instead of the model's generate."""
    return isinstance(model, WhisperGenerationMixin)


def positions_follow_mask(model):
    """Whether ``model``'s decoder positions count the attended tokens of a
    ``decoder_attention_mask`` (Whisper's ``prepare_inputs_for_generation``: long-form prompts
    conditioned on previous segments are left-padded) instead of counting cache positions."""
    hook = getattr(type(model), "prepare_inputs_for_generation", None)
    return hook is WhisperForConditionalGeneration.prepare_inputs_for_generation


def reproduces_hook(model, hook):
    """Whether the encoder-decoder loop reproduces ``model``'s override of transformers'
    ``hook`` (so the override need not refuse the model)."""
    return hook == "prepare_inputs_for_generation" and positions_follow_mask(model)


def decoder_positions(mask, n):
    """``decoder_position_ids`` [B, n] of the last `n` of the positions `mask` [B, L] covers,
    as Whisper computes them: attended tokens before each one; 0 at padding."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 0)[:, -n:]
