"""What one generate() call resolved, before anything is allocated: config, inputs, plan.

transformers 5.x's own helpers decide the config priority, inputs / inputs_embeds, special
tokens, masks, positions, lengths, processors and stopping criteria; this module keeps their
results in declared, frozen types (:class:`Extras`, :class:`Resolved`, :class:`Inputs`,
:class:`Plan`) and refuses what the decode loop cannot honour.
"""
import dataclasses
import inspect
from typing import Any, Optional

import torch
from transformers.cache_utils import Cache
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc

from .. import params as sampling_params
from . import compat
from .amateur import Amateur
from .common import (Unsupported, cache_rows, cached_positions, device_eos,
                     drop_never_forwarded, is_in, refuse_stateful_cache, take_passed_cache,
                     whole_max_length)
from .processors import TokenEdits, finite_number, plan_processors, refuse_config
from .step_inputs import StepInputs, refuse_cache_reset, refuse_inputs, split_inputs

__all__ = ["Extras", "Resolved", "Inputs", "Plan", "refuse_arguments", "pop_extras",
           "resolve_config", "prepare_inputs", "processors", "refuse_beam_options",
           "plan_step"]

_UNSUPPORTED_ARGS = ("assistant_tokenizer",)


@dataclasses.dataclass(frozen=True)
class Extras:
    """The arguments transformers' generate does not have, validated."""
    presence: float                  # presence_penalty
    frequency: float                 # frequency_penalty
    seed: Any                        # None, an int or a LongTensor of row seeds
    compile: bool
    tokenizer: Any                   # for stop_strings
    amateur: Optional[Amateur]       # contrastive decoding


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The generation config after transformers' priority rules, and the model kwargs left."""
    gc: Any
    model_kwargs: dict
    has_default_max: bool
    has_default_min: bool


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The prompt as the model will see it.

    Two coordinate systems: the returned sequences (``input_ids`` plus new tokens, L0 prompt
    columns) and the model's kv positions (P prompt positions: inputs_embeds or ids, plus what
    a passed cache already holds).
    """
    gc: Any                          # the config, lengths resolved
    model_kwargs: dict               # position_ids, token_type_ids, pixel_values, ...
    input_ids: torch.Tensor          # [B, L0], expanded for num_return_sequences / num_beams
    embeds: Optional[torch.Tensor]   # inputs_embeds [B, P - past, H] or None
    mask: torch.Tensor               # [B, P]
    cache: Optional[Cache]           # the caller's cache, or None
    device: torch.device
    B: int                           # rows, expanded
    B0: int                          # rows as passed
    L0: int                          # prompt columns of the returned sequences
    P: int                           # prompt kv positions
    past: int                        # positions the passed cache holds
    new: int                         # prompt positions the prefill feeds
    max_new: int                     # at most this many new tokens
    kv_total: int                    # positions the model holds at the end


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the decode loop processes, samples and stops, resolved once for the call."""
    inputs: Inputs
    torch_procs: lp.LogitsProcessorList      # processors that run in torch before sample()
    edits: TokenEdits                        # single-token processors: sample()'s logit_bias
    host_crit: sc.StoppingCriteriaList       # criteria checked on the host (not length / EOS)
    has_eos: bool                            # some criterion stops on EOS: pad after it
    eos: Optional[torch.Tensor]              # the ids the device test stops on (device_eos)
    pad: Optional[torch.Tensor]
    sample_kw: dict                  # sample()'s fused arguments (row seeds included)
    ref_kw: dict                     # the same for the reported scores (no seeds)
    seeded: bool                     # draws keyed on (row seed, position)
    compile: bool
    amateur: Optional[Amateur]
    want_scores: bool
    want_logits: bool
    want_attn: bool
    want_hidden: bool
    cache_arg: str                   # the model's name for its cache argument
    takes_mask: bool
    takes_pos: bool
    logits_to_keep: Optional[int]
    step: StepInputs                 # the other model inputs, by the forwards that get them
    # transformers' is_first_iteration for the prefill: False in an assistant's call
    # (generation_config.is_assistant, set by its assisted decoding), whose prefill then gets
    # what a decode forward gets (no prefill-only image inputs; a model's own decode view).
    first_iteration: bool

    @property
    def gc(self):
        return self.inputs.gc


def refuse_arguments(synced_gpus, **named):
    for name, value in named.items():
        if value is not None:
            raise Unsupported(f"`{name}`")
    if synced_gpus:
        raise Unsupported("`synced_gpus=True`")


def pop_extras(model, kwargs):
    """Remove and validate the arguments transformers' generate does not have."""
    for name in _UNSUPPORTED_ARGS:
        if kwargs.pop(name, None) is not None:
            raise Unsupported(f"`{name}`")
    return Extras(
        presence=finite_number("presence_penalty", kwargs.pop("presence_penalty", 0.0)),
        frequency=finite_number("frequency_penalty", kwargs.pop("frequency_penalty", 0.0)),
        seed=kwargs.pop("seed", None),
        compile=bool(kwargs.pop("compile", False)),
        tokenizer=kwargs.pop("tokenizer", None),
        amateur=Amateur.from_kwargs(model, kwargs))


def resolve_config(model, generation_config, kwargs):
    """transformers' config priority: kwargs > generation_config > the model's defaults."""
    if getattr(model.config, "is_encoder_decoder", False):
        # (generate() sends every encoder-decoder model to hf/seq2seq.py: a guard for other
        # callers of this helper)
        raise Unsupported(f"{type(model).__name__} (an encoder-decoder model with its own "
                          f"generate)")
    if compat.cache_arg(model) not in inspect.signature(model.forward).parameters:
        raise Unsupported(f"{type(model).__name__} (its forward takes no cache: transformers "
                          f"feeds it the whole sequence each step)")
    if not model._supports_default_dynamic_cache():
        raise Unsupported(f"{type(model).__name__} (its cache is not a transformers key/value "
                          f"Cache)")
    gc, model_kwargs, has_default_max, has_default_min = compat.transformers_config(
        model, generation_config, kwargs)
    refuse_config(gc, allowed=("prompt_lookup_num_tokens",))  # hf/assisted.py runs it
    refuse_inputs(model, drop_never_forwarded(model_kwargs))
    return Resolved(gc, model_kwargs, has_default_max, has_default_min)


def _check_prompt(input_ids):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a 2-D LongTensor [batch, length], got "
                         f"{getattr(input_ids, 'shape', type(input_ids))}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one "
                         f"prompt token per row (e.g. the bos token)")
    if input_ids.dtype.is_floating_point:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")


def _model_inputs(model, gc, mk, inputs):
    """(prompt tensor, its name, input_ids, model kwargs) with mask and positions filled in."""
    inputs_tensor, input_name, mk = model._prepare_model_inputs(inputs, gc.bos_token_id, mk)
    if input_name == "input_ids":
        _check_prompt(inputs_tensor)
        inputs_tensor = inputs_tensor.to(torch.long)
    device = inputs_tensor.device
    has_mask = mk.get("attention_mask") is not None
    model._prepare_special_tokens(gc, has_mask, device=device, batch_size=inputs_tensor.shape[0])
    if not has_mask:
        mk["attention_mask"] = model._prepare_attention_mask_for_generation(inputs_tensor, gc, mk)
    mask = mk["attention_mask"]
    if mask.dim() != 2 or mask.shape[0] != inputs_tensor.shape[0]:
        raise ValueError(f"attention_mask must be 2-D [batch, length] with batch "
                         f"{inputs_tensor.shape[0]}, got {tuple(mask.shape)}")
    mk["attention_mask"] = mask.to(device)
    if mk.get("position_ids") is None:
        mk["position_ids"] = model._prepare_position_ids_for_generation(inputs_tensor, mk)
    # transformers (>= 5.2x) encodes the images of vision-language models here, before the
    # rows are expanded (mm_encoder_outputs, forwarded at the prefill): so do we.
    encode = getattr(model, "_maybe_prepare_encoder_kwargs_for_generation", None)
    if encode is not None:
        mk = encode(inputs_tensor, mk, input_name, gc)
    input_ids = inputs_tensor if input_name == "input_ids" else mk.pop("input_ids")
    input_ids = input_ids.to(device=device, dtype=torch.long)
    if input_name == "inputs_embeds":
        gc.use_cache = True  # transformers: embeddings are only consumed with a cache
    return inputs_tensor, input_name, input_ids, mk


def _passed_cache(gc, mk):
    cache = take_passed_cache(gc, mk)
    if cache is not None and not isinstance(cache, Cache):
        raise ValueError(f"past_key_values must be a transformers Cache (DynamicCache, "
                         f"StaticCache, StaticKVCache), got {type(cache).__name__}")
    refuse_stateful_cache(cache)
    return cache


def _fed_positions(cache, embeds, mask, L0):
    """(past, new): positions a passed cache holds, positions the prefill feeds."""
    # int(): transformers' StaticCache returns its live position counter (a tensor).
    past = cached_positions(cache)
    if embeds is not None:
        new = embeds.shape[1] - past
    elif mask.shape[1] == L0:
        new = L0 - past   # the full sequence was passed: feed what the cache lacks
    else:
        new = L0          # only the new tokens were passed, the mask covers the cache too
    if new <= 0:
        raise ValueError(f"past_key_values already holds {past} positions, the input has none "
                         f"beyond them: pass the cached sequence plus new tokens")
    if mask.shape[1] != past + new:
        raise ValueError(f"attention_mask has {mask.shape[1]} positions but the prompt (with "
                         f"past_key_values) has {past + new}")
    if embeds is None and new > L0:
        raise ValueError(f"input_ids has {L0} tokens, fewer than the {new} to feed")
    return past, new


def prepare_inputs(model, resolved, inputs):
    """Prompt, mask, positions and lengths, as transformers' generate prepares them."""
    gc = resolved.gc
    inputs_tensor, input_name, input_ids, mk = _model_inputs(model, gc, resolved.model_kwargs,
                                                             inputs)
    expand = max(gc.num_beams or 1, gc.num_return_sequences or 1)
    input_ids, mk = model._expand_inputs_for_generation(input_ids=input_ids, expand_size=expand,
                                                         **mk)
    L0 = input_ids.shape[1]
    gc = model._prepare_generated_length(gc, resolved.has_default_max, resolved.has_default_min,
                                         input_name, inputs_tensor=inputs_tensor,
                                         input_ids_length=L0)
    model._validate_generated_length(gc, L0, resolved.has_default_max)
    gc = whole_max_length(gc)
    cache = _passed_cache(gc, mk)
    embeds = mk.pop("inputs_embeds", None)
    mask = mk.pop("attention_mask")
    past, new = _fed_positions(cache, embeds, mask, L0)
    P, max_new = past + new, gc.max_length - L0
    refuse_cache_reset(model, P, max(P + max_new - 1, P))
    return Inputs(gc=gc, model_kwargs=mk, input_ids=input_ids, embeds=embeds, mask=mask,
                  cache=cache, device=inputs_tensor.device, B=input_ids.shape[0],
                  B0=inputs_tensor.shape[0], L0=L0, P=P, past=past, new=new, max_new=max_new,
                  # Positions the model will hold at the end (the last token is never fed), as
                  # transformers sizes max_cache_length.
                  kv_total=max(P + max_new - 1, P))


def processors(model, inputs, logits_processor):
    """transformers' processor list for this call (user processors merged by its rules)."""
    user_lp = list(logits_processor or [])
    procs = model._get_logits_processor(
        generation_config=inputs.gc, input_ids_seq_length=inputs.L0,
        encoder_input_ids=inputs.input_ids, prefix_allowed_tokens_fn=None,
        logits_processor=lp.LogitsProcessorList(user_lp), device=inputs.device,
        model_kwargs={"attention_mask": inputs.mask})
    return procs, user_lp


def refuse_beam_options(inputs, extras):
    """What the beam-search loop (num_beams > 1) does not run."""
    unsupported = [name for name, on in (
        ("presence_penalty", extras.presence), ("frequency_penalty", extras.frequency),
        ("compile", extras.compile), ("amateur_model", extras.amateur is not None),
        # transformers does not expand a passed cache: it runs only on one the caller built
        # with B * num_beams rows (else the model's cat fails), and never without the cache.
        ("past_key_values without B * num_beams rows", inputs.cache is not None and (
            cache_rows(inputs.cache) not in (None, inputs.B) or inputs.gc.use_cache is False))
    ) if on]
    if unsupported:
        raise Unsupported(f"{unsupported} with num_beams > 1")


def _criteria(model, gc, stopping_criteria, tokenizer):
    """(has_eos, host criteria, device eos ids): the loop bound and the on-device EOS test
    replace the built length / EOS criteria."""
    user_sc = list(stopping_criteria or [])
    crit = model._get_stopping_criteria(gc, sc.StoppingCriteriaList(user_sc), tokenizer)
    has_eos = any(hasattr(c, "eos_token_id") for c in crit)
    host = sc.StoppingCriteriaList(
        c for c in crit if is_in(c, user_sc)
        or not isinstance(c, (sc.MaxLengthCriteria, sc.EosTokenCriteria)))
    if has_eos and gc._pad_token_tensor is None:
        raise ValueError("eos_token_id is set but pad_token_id is None: set pad_token_id")
    return has_eos, host, device_eos(crit, user_sc)


def plan_step(model, inputs, logits_processor, stopping_criteria, extras):
    """Processors, stopping criteria, the fused sample() arguments and what is returned."""
    gc = inputs.gc
    procs, user_lp = processors(model, inputs, logits_processor)
    torch_procs, fused, edits = plan_processors(procs, user_lp, bool(gc.do_sample))
    has_eos, host_crit, eos = _criteria(model, gc, stopping_criteria, extras.tokenizer)
    sample_kw = dict(fused)
    sample_kw.setdefault("repetition_penalty", 1.0)
    sample_kw["presence_penalty"] = extras.presence
    sample_kw["frequency_penalty"] = extras.frequency
    ref_kw = dict(sample_kw)
    if extras.seed is not None:
        sample_kw["seed"] = sampling_params.row_seeds(extras.seed, inputs.B, inputs.device)
    amateur = extras.amateur
    step = split_inputs(model, inputs.model_kwargs)
    if gc.is_assistant and inputs.embeds is not None:
        # transformers' assistant prefill (is_first_iteration False) reads the ids instead.
        raise Unsupported("inputs_embeds in an assistant's call (generation_config.is_assistant)")
    if amateur is not None and (inputs.embeds is not None or inputs.past or step.multimodal):
        raise Unsupported("amateur_model with inputs_embeds, a filled past_key_values or image "
                          "inputs", "contrastive decoding (amateur_model) takes input_ids "
                          "only: not inputs_embeds, a filled past_key_values or image inputs")
    rd = bool(gc.return_dict_in_generate)
    want_scores, want_logits = rd and bool(gc.output_scores), rd and bool(gc.output_logits)
    if amateur is not None:
        # Contrastive scores go straight into sample()'s launches (amateur_logits) unless a
        # torch-side processor or a returned tensor needs them materialised.
        amateur = amateur.fused(not (len(torch_procs) or want_scores or want_logits))
    params = inspect.signature(model.forward).parameters
    return Plan(
        inputs=inputs, torch_procs=torch_procs, edits=edits, host_crit=host_crit, has_eos=has_eos,
        eos=eos, pad=gc._pad_token_tensor, sample_kw=sample_kw, ref_kw=ref_kw,
        seeded=extras.seed is not None, compile=extras.compile, amateur=amateur,
        want_scores=want_scores, want_logits=want_logits,
        want_attn=rd and bool(gc.output_attentions),
        want_hidden=rd and bool(gc.output_hidden_states),
        cache_arg=compat.cache_arg(model), takes_mask="attention_mask" in params,
        takes_pos="position_ids" in params,
        logits_to_keep=inputs.model_kwargs.get(
            "logits_to_keep", 1 if "logits_to_keep" in params else None), step=step,
        first_iteration=not gc.is_assistant)
