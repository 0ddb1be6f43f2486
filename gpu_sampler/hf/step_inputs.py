"""Model inputs beyond the prompt, mask and cache: which forward gets them, and how.

transformers' generate decides per input, and so does the loop here, from transformers' own
rules rather than per-model code:

* **prefill-only** inputs (``pixel_values``, ``pixel_attention_mask``, ``image_sizes``, ...:
  transformers' ``MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL``) reach the prefill only (every
  forward without a cache);
* **per-position** inputs (``token_type_ids``, ``mm_token_type_ids``, ...) are sliced to the
  fed positions like ``input_ids``; a generated token gets what the model's own
  ``_update_model_kwargs_for_generation`` appends (the last value, PaliGemma's 1, the zeros of
  ``mm_token_type_ids``), and a model whose ``prepare_inputs_for_generation`` stops forwarding
  one after the prefill (Gemma 3's token types) gets it at the prefill only;
* a **position offset** the model's ``prepare_inputs_for_generation`` adds (PaliGemma counts
  from 1) is added to every forward's ``position_ids``;
* everything else the model's forward takes (``image_grid_thw``, ...) is forwarded unchanged
  at every step, as transformers forwards its remaining model kwargs.

Both model hooks are probed once per call on two-token tensors (no forward runs). Image inputs
are accepted for the model types in :data:`VISION_MODEL_TYPES`, each checked token for token
against transformers; other models with such inputs are refused (``Unsupported``).
"""
import dataclasses
import inspect

import torch
from transformers.generation.utils import GenerationMixin

from . import compat
from .common import Unsupported

__all__ = ["StepInputs", "PER_POSITION", "PREFILL_ONLY", "VISION_MODEL_TYPES", "refuse_inputs",
           "refuse_cache_reset", "split_inputs"]

try:  # transformers >= 5.2x names them; the older list is the same idea, spelled out
    from transformers.generation.utils import MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL
    PREFILL_ONLY = tuple(MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL)
except ImportError:  # pragma: no cover - older transformers
    PREFILL_ONLY = ("pixel_values", "pixel_values_videos", "pixel_attention_mask",
                    "image_sizes", "pixel_mask", "input_features", "input_values")

# Inputs transformers slices to the fed positions like input_ids.
PER_POSITION = ("token_type_ids", "mm_token_type_ids", "moe_mm_token_type_ids")

# Model types whose image inputs run here (tests/test_vlm.py checks each against transformers).
VISION_MODEL_TYPES = frozenset({"llava", "qwen2_vl", "qwen2_5_vl", "gemma3", "paligemma",
                                "idefics3", "smolvlm"})

# What the decode loop handles itself (never forwarded as a constant).
_OWN = frozenset({"past_key_values", "cache", "inputs_embeds", "position_ids", "input_ids",
                  "logits_to_keep", "output_attentions", "output_hidden_states",
                  "attention_mask", "use_cache"})


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """The model kwargs of one call, by the forwards that get them."""
    prefill: dict        # name -> value, the prefill only (every forward without a cache)
    every: dict          # name -> value, every forward, unchanged
    typed: dict          # name -> [B, P] per-position tensor (prompt kv positions)
    fill: dict           # name -> None (the last value repeats) or the value a new token gets
    decode_typed: tuple  # per-position names forwarded after the prefill too
    pos_offset: int      # added to every forward's position_ids
    # False where the model's prepare_inputs_for_generation drops the attention mask of a
    # decode step on a cache (Mamba, FalconMamba: their mixers multiply the step's states by
    # the whole 2-D mask, which would broadcast a one-token step to the mask's length)
    decode_mask: bool = True

    @property
    def multimodal(self):
        return bool(self.prefill or self.every) or self.pos_offset != 0

    def per_position(self, P, width):
        """(name -> [B, width] buffer by kv position: the given values right-aligned to the P
        prompt positions, then what a generated token gets; name -> [B, 1] that value: the
        last one repeated, or the model's constant)."""
        bufs, new = {}, {}
        for name, given in self.typed.items():
            fill = self.fill.get(name)
            last = given[:, -1:] if fill is None else torch.full_like(given[:, -1:], fill)
            buf = last.expand(-1, width).contiguous()
            k = min(P, given.shape[1])
            buf[:, P - k:P] = given[:, given.shape[1] - k:]
            bufs[name], new[name] = buf, last
        return bufs, new


def refuse_inputs(model, model_kwargs):
    """Unsupported for model kwargs the loop does not forward: image inputs of model types not
    in VISION_MODEL_TYPES, and any other argument transformers would forward."""
    other = sorted(k for k, v in model_kwargs.items()
                   if v is not None and k not in _OWN and k not in PER_POSITION)
    if not other:
        return
    model_type = getattr(model.config, "model_type", None)
    if model_type not in VISION_MODEL_TYPES:
        raise Unsupported(f"the model arguments {other}",
                          f"gpu_sampler.generate does not support the model arguments {other} "
                          f"for {type(model).__name__} (model_type {model_type!r})")


def _overrides(model, name):
    return getattr(type(model), name, None) is not getattr(GenerationMixin, name)


def _fills(model, names):
    """name -> None (repeat the last value) or the value transformers gives a generated token,
    read off the model's own _update_model_kwargs_for_generation."""
    probe = {n: torch.tensor([[5, 7]]) for n in names}
    try:
        grown = model._update_model_kwargs_for_generation({}, dict(probe), num_new_tokens=1)
    except Exception:  # noqa: BLE001 - a hook we cannot probe: transformers' generic rule
        return {n: None for n in names}
    out = {}
    for n in names:
        new = int(grown[n][0, -1])
        out[n] = None if new == 7 else new
    return out


def _refuse_own_view(model, got, ids):
    """Unsupported where the model's prepare_inputs_for_generation feeds other tokens than the
    step's (XLM, FlauBERT append a mask token) or drops the position ids (Kosmos-2's text model
    derives them from the ids and padding, GLM-Image and EXAONE 4.5 recompute their rope):
    the loop here feeds the step's tokens at their positions."""
    name = type(model).__name__
    fed = got.get("input_ids")
    if isinstance(fed, torch.Tensor) and tuple(fed.shape) != tuple(ids.shape):
        raise Unsupported(f"{name} (its prepare_inputs_for_generation feeds other tokens)")
    if got.get("position_ids") is None and \
            "position_ids" in inspect.signature(model.forward).parameters:
        raise Unsupported(f"{name} (its prepare_inputs_for_generation drops position_ids)")


def _decode_view(model, names):
    """(position offset, per-position names forwarded after the prefill, whether the attention
    mask is forwarded), read off the model's own prepare_inputs_for_generation for a decode
    step."""
    if not _overrides(model, "prepare_inputs_for_generation"):
        return 0, tuple(names), True
    ids = torch.tensor([[3, 4]])
    pos = torch.tensor([[0, 1]])
    try:
        got = model.prepare_inputs_for_generation(
            ids, attention_mask=torch.ones_like(ids), position_ids=pos, use_cache=True,
            is_first_iteration=False, **{n: torch.tensor([[0, 1]]) for n in names})
    except Exception:  # noqa: BLE001 - a hook we cannot probe: transformers' generic rule
        return 0, tuple(names), True
    _refuse_own_view(model, got, ids)
    got_pos = got.get("position_ids")
    offset = int(got_pos.reshape(-1)[-1].cpu()) - 1 if got_pos is not None else 0
    return (offset, tuple(n for n in names if got.get(n) is not None),
            got.get("attention_mask") is not None)


class _SeenCache:
    """A stand-in cache for probing prepare_inputs_for_generation: holds `n` positions."""

    def __init__(self, n):
        self.n = n

    def get_seq_length(self, layer_idx=0):
        return self.n


def refuse_cache_reset(model, P, kv_total):
    """Unsupported where the model's prepare_inputs_for_generation drops the cache at a length
    this call reaches (Phi-3 / PhiMoE with LongRoPE: crossing original_max_position_embeddings,
    transformers re-runs the whole sequence with the long factors; the cache holds short-factor
    keys)."""
    cfg = model.config.get_text_config(decoder=True)
    limit = getattr(cfg, "original_max_position_embeddings", None)
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if (not isinstance(limit, int) or rope == "default" or not P <= limit < kv_total
            or not _overrides(model, "prepare_inputs_for_generation")):
        return
    ids, name = torch.ones(1, limit + 1, dtype=torch.long), compat.cache_arg(model)
    try:
        got = model.prepare_inputs_for_generation(
            ids, next_sequence_length=1, attention_mask=torch.ones_like(ids), use_cache=True,
            is_first_iteration=False, **{name: _SeenCache(limit)})
    except Exception:  # noqa: BLE001 - a hook we cannot probe: transformers' generic rule
        return
    if got.get(name) is None or got["input_ids"].shape[1] != 1:
        raise Unsupported(f"{type(model).__name__} generating past {limit} positions (its "
                          f"prepare_inputs_for_generation re-runs the whole sequence there: "
                          f"{rope} rope)")


def split_inputs(model, model_kwargs):
    """The call's StepInputs from its model kwargs (after refuse_inputs)."""
    typed = {n: model_kwargs[n] for n in PER_POSITION if model_kwargs.get(n) is not None}
    rest = {k: v for k, v in model_kwargs.items()
            if v is not None and k not in _OWN and k not in PER_POSITION}
    offset, decode_typed, decode_mask = _decode_view(model, list(typed))
    return StepInputs(
        prefill={k: v for k, v in rest.items() if k in PREFILL_ONLY},
        every={k: v for k, v in rest.items() if k not in PREFILL_ONLY},
        typed=typed, fill=_fills(model, list(typed)) if typed else {},
        decode_typed=decode_typed, pos_offset=offset, decode_mask=decode_mask)
