"""Pieces that transformers' decode loops here share: generate() and beam search."""
import math

import torch
from transformers.cache_utils import CacheLayerMixin
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc

from . import compat
from .cache import StaticKVCache

# Pure -inf masks: they commute with the repetition penalty and the log-softmax shift (a
# masked -inf stays -inf), so they can run in torch before a fused step.
MASKS = (lp.NoRepeatNGramLogitsProcessor, lp.NoBadWordsLogitsProcessor,
         lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor,
         lp.SuppressTokensLogitsProcessor, lp.SuppressTokensAtBeginLogitsProcessor)


def is_mask(p):
    """A transformers mask processor of MASKS's own classes: a user's subclass may do anything
    (add a bias, ...), which need not commute with the penalty fused behind it."""
    return type(p) in MASKS


def unwrap_compiled(model):
    """The module a ``torch.compile(model)`` wrapper (``OptimizedModule``) holds: transformers'
    ``compiled.generate`` is the wrapped module's own generate (attribute lookup falls
    through to it), so generate() and patch() act on that module as transformers does."""
    from torch._dynamo.eval_frame import OptimizedModule
    while isinstance(model, OptimizedModule):
        model = model._orig_mod
    return model


def history_skip(skip, L0, sample_kw):
    """The history columns hidden from the penalties: ``skip`` (a mask's first attended kv
    position, compared with sequence columns as transformers' repetition penalty does; past
    the prompt width L0 it hides generated tokens: inputs_embeds, a passed cache with only the
    new ids), at most L0 when presence / frequency penalties are on, which count every
    generated token (they are not transformers'; the history is one tensor for all three)."""
    if sample_kw.get("presence_penalty") or sample_kw.get("frequency_penalty"):
        return skip.clamp(max=L0)
    return skip


def is_in(obj, items):
    """Identity membership (processors define no useful ==)."""
    return any(obj is x for x in items)


def device_eos(crit, user_sc):
    """The eos ids the on-device test checks: those of the EosTokenCriteria transformers built
    from the config, None when there is none (no eos_token_id, or a user EosTokenCriteria
    took its place in transformers' merge: that one runs on the host)."""
    built = [c.eos_token_id for c in crit
             if isinstance(c, sc.EosTokenCriteria) and not is_in(c, user_sc)]
    return built[0] if built else None


def whole_max_length(gc):
    """gc with an integer max_length. transformers stops once the length reaches it
    (MaxLengthCriteria: cur_len >= max_length), so max_new_tokens=2.5 makes 3 tokens there;
    the loops size their buffers in tokens, so they take the ceiling, which stops at the same
    step."""
    if isinstance(gc.max_length, float) and math.isfinite(gc.max_length):
        gc.max_length = math.ceil(gc.max_length)
    return gc


def prompt_history_mask(mask, width):
    """bool [B, width]: the positions before each row's first attended prompt token (left
    padding), which the repetition penalty ignores like transformers' prompt_ignore_length."""
    first = (mask != 0).int().argmax(dim=1)
    return torch.arange(width, device=mask.device)[None, :] < first[:, None]


class Unsupported(NotImplementedError):
    """What gpu_sampler.generate does not run: an argument, a setting or a model kind.

    ``feature`` names it; a patched ``model.generate`` warns once per model and feature when it
    hands such a call to transformers. Raised while the call is resolved, before the model runs,
    a cache is written, a streamer is fed or a random number is drawn.
    """

    def __init__(self, feature, message=None):
        self.feature = feature
        super().__init__(message or f"gpu_sampler.generate does not support {feature}")


def raise_if_invalid(invalid):
    """ValueError naming the rows (bool [B] `invalid`) that drew no valid token."""
    if bool(invalid.any()):
        rows = invalid.nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} have no valid token to sample (NaN logits, or every token "
                         f"filtered to -inf by the processors)")


def own_cache(model, batch, length):
    """Our StaticKVCache for `length` positions of a decoder-only model, or None where it would
    not give what transformers' default DynamicCache gives: layer types it does not hold, or a
    decoder whose attention is not causal by itself (PaliGemma's Gemma: ``is_causal`` False).
    There transformers' mask code skips the mask of an unpadded prompt on a DynamicCache (so
    the prompt attends both ways) but never on a static cache (causal): logits 1e-3 apart."""
    if _attends_both_ways(model):
        return None
    try:
        return StaticKVCache(model.config, batch, length, exact_length=exact_span(model))
    except (ValueError, NotImplementedError):  # layer types it does not hold: DynamicCache
        return None


def exact_span(model):
    """Whether our StaticKVCache must return the written positions only (``exact_length``),
    as transformers' DynamicCache does: a half-precision model on the CPU. There torch's
    attention over the static buffer's longer, masked key span rounds differently from the
    same attention over the written keys (bf16 / fp16 logits 1 ulp apart from the prefill
    on: other greedy tokens at near ties, other beams); in float32 the two agree bit for bit."""
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "cpu" and p.dtype in (torch.float16,
                                                                    torch.bfloat16)


def _attends_both_ways(model):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    return any(getattr(m, "is_causal", True) is False for m in decoder.modules())


def take_passed_cache(gc, model_kwargs):
    """The caller's cache, removed from generate's model kwargs (either name), with
    transformers' check against ``cache_implementation``; None when none was passed."""
    cache = compat.pop_cache(model_kwargs)
    if cache is not None and gc.cache_implementation is not None:
        raise ValueError("Passing both `cache_implementation` and `past_key_values` (a Cache "
                         "object) is unsupported. Please use only one of the two.")
    return cache


def cached_positions(cache):
    """Positions a cache holds (0 for None). A cache of linear-attention layers only (Mamba's
    DynamicCache) has no sequence length: transformers' get_seq_length raises there, and such a
    cache holds no positions the loop must skip (a filled one is refused when passed:
    :func:`refuse_stateful_cache`)."""
    if cache is None or _attention_free(cache):
        return 0
    return int(cache.get_seq_length())


def _attention_free(cache):
    layers = getattr(cache, "layers", None)
    return bool(layers) and not any(isinstance(layer, CacheLayerMixin) for layer in layers)


def refuse_stateful_cache(cache):
    """Unsupported for a passed cache of linear-attention layers that already holds a state
    (Mamba's): it has no sequence length, and transformers' generate feeds the whole input on
    top of it (its own generate is the reference)."""
    if cache is not None and _attention_free(cache) and any(
            any(getattr(layer, "has_previous_state", {}).values()) for layer in cache.layers):
        raise Unsupported("a filled past_key_values of linear-attention layers only (Mamba)",
                          "gpu_sampler.generate does not support continuing from a filled "
                          "past_key_values whose layers are all linear-attention (state-space) "
                          "layers: it holds no sequence length")


def cache_rows(cache):
    """The batch rows a cache's layers hold, None before its first write. transformers never
    expands a passed cache: generate runs on one only when it holds the expanded rows."""
    for layer in getattr(cache, "layers", ()):
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_initialized", False) and isinstance(keys, torch.Tensor):
            return keys.shape[0]
    return None


# Model kwargs transformers' prepare_inputs_for_generation never forwards (a tester's `labels`
# would make the prefill compute a loss against one position's logits).
NEVER_FORWARDED = ("labels", "next_sequence_length")


def drop_never_forwarded(model_kwargs):
    for name in NEVER_FORWARDED:
        model_kwargs.pop(name, None)
    return model_kwargs
