"""Drop-in replacement for ``model.generate`` (greedy and sampling) built on ``sample()``.

Configuration and inputs are resolved exactly as transformers 5.x does it (the model's own
helpers for config priority, inputs / inputs_embeds, special tokens, masks, positions, lengths,
processors and stopping criteria), then one prefill and a decode loop. The loop runs on an
internal :class:`~gpu_sampler.hf.cache.StaticKVCache` that stands in for transformers' default
``DynamicCache`` (and is converted to one when returned), or on the cache transformers would use
(a passed ``past_key_values``, ``cache_implementation="static"``, ...). Penalties, temperature,
top-k, top-p, min-p and the draw happen in one ``sample()`` call per step; transformers' other
processors and user processors run in torch first, in transformers' order.

One function, one job: ``generate`` -> ``_resolve_config`` (config priority) ->
``_refuse_unsupported`` -> ``_prepare_inputs`` (prompt, mask, positions, lengths, passed cache)
-> ``_plan_step`` (processors, criteria, sample() arguments) -> ``_allocate`` (working cache and
buffers) -> ``_decode`` (prefill, loop, outputs).
"""
import inspect
import types

import torch
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .. import params as sampling_params
from ..contrastive import contrastive_scores
from ..reference import processed_logits_reference
from ..sampler import sample
from .amateur import pop_generate_args
from .cache import StaticKVCache
from . import compat, seq2seq
from .common import MASKS, Unsupported, is_in, prompt_history_mask

__all__ = ["generate", "EXTRA_ARGS"]

# generate() arguments transformers' generate does not have (a call using one cannot be handed
# to transformers without changing its meaning).
EXTRA_ARGS = ("presence_penalty", "frequency_penalty", "seed", "compile", "amateur_model",
              "cd_alpha", "cd_beta")

# How often (in decode steps) the loop reads `unfinished.any()` back to the host. Between
# checks no step synchronises; steps run after every row finished are trimmed from the output.
_CHECK_EVERY = 8

# Warpers fused into sample(), in transformers' order.
_WARPERS = ((lp.TemperatureLogitsWarper, "temperature"), (lp.TopKLogitsWarper, "top_k"),
            (lp.TopPLogitsWarper, "top_p"), (lp.MinPLogitsWarper, "min_p"))
# transformers processors generate() would build that this loop does not implement, by the
# argument that turns them on.
_UNSUPPORTED_PROCESSORS = {
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "EncoderNoRepeatNGramLogitsProcessor": "encoder_no_repeat_ngram_size",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
}
# transformers' own processors that run as they are, in torch, at their place in the chain (a
# warper behind them is not fused, so the order stays transformers').
_TORCH_ONLY = (lp.InfNanRemoveLogitsProcessor, lp.SequenceBiasLogitsProcessor,
               lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper, lp.EtaLogitsWarper,
               lp.TopHLogitsWarper, lp.SuppressTokensLogitsProcessor,
               lp.SuppressTokensAtBeginLogitsProcessor, lp.ForcedBOSTokenLogitsProcessor,
               lp.ForcedEOSTokenLogitsProcessor, lp.ExponentialDecayLengthPenalty,
               lp.LogitNormalization, lp.WatermarkLogitsProcessor,
               lp.SynthIDTextWatermarkLogitsProcessor)
# generate() arguments with a non-default value that this loop cannot honour.
_UNSUPPORTED_CONFIG = (
    ("num_beam_groups", lambda v: v is not None and v > 1),
    ("diversity_penalty", lambda v: v not in (None, 0.0)),
    ("penalty_alpha", lambda v: v is not None),
    ("dola_layers", lambda v: v is not None),
    ("guidance_scale", lambda v: v is not None and v != 1),
    ("prompt_lookup_num_tokens", lambda v: v is not None),
    ("assistant_early_exit", lambda v: v is not None),
    ("token_healing", lambda v: bool(v)),
    ("constraints", lambda v: v is not None),
    ("force_words_ids", lambda v: v is not None),
    ("cache_implementation", lambda v: v == "paged"),
    ("prefill_chunk_size", lambda v: v is not None),
)
_UNSUPPORTED_ARGS = ("assistant_tokenizer",)
# Model inputs generate() forwards to the model besides the prompt and its attention mask.
_MODEL_INPUTS = ("past_key_values", "cache", "inputs_embeds", "position_ids", "token_type_ids",
                 "logits_to_keep", "input_ids", "output_attentions", "output_hidden_states")
# New positions the buffers hold before the first doubling.
_INITIAL_NEW_POSITIONS = 256


def _plan_processors(procs, user, do_sample):
    """Split transformers' processor list into (torch-side list, fused sample() kwargs).

    The fast path fuses the repetition penalty and the trailing warpers; user processors force
    the penalty into torch so it still runs before them, as in transformers.
    """
    for p in procs:
        name = type(p).__name__
        if not is_in(p, user) and name in _UNSUPPORTED_PROCESSORS:
            arg = _UNSUPPORTED_PROCESSORS[name]
            raise Unsupported(f"`{arg}`", f"gpu_sampler.generate does not support `{arg}` "
                                          f"({name}); use model.generate for it")
        if not is_in(p, user) and not isinstance(
                p, MASKS + _TORCH_ONLY + (lp.RepetitionPenaltyLogitsProcessor,)
                + tuple(c for c, _ in _WARPERS)):
            raise Unsupported(name, f"gpu_sampler.generate does not support the logits "
                                    f"processor {name} that the generation config enables")
    fused = {}
    cut = len(procs)
    rank = len(_WARPERS)
    while cut > 0 and do_sample:
        p = procs[cut - 1]
        r = next((i for i, (c, _) in enumerate(_WARPERS) if type(p) is c), None)
        if r is None or r >= rank or is_in(p, user) or getattr(p, "min_tokens_to_keep", 1) != 1:
            break
        fused[_WARPERS[r][1]] = getattr(p, _WARPERS[r][1])
        rank, cut = r, cut - 1
    head = list(procs[:cut])
    pure = all(isinstance(p, MASKS) or (type(p) is lp.RepetitionPenaltyLogitsProcessor
                                         and not is_in(p, user)) for p in head)
    if pure:
        for p in head:
            if type(p) is lp.RepetitionPenaltyLogitsProcessor:
                fused["repetition_penalty"] = float(p.penalty)
        head = [p for p in head if type(p) is not lp.RepetitionPenaltyLogitsProcessor]
    if not do_sample:
        fused["temperature"] = 0.0
    return lp.LogitsProcessorList(head), fused


def _check_extra(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@torch.no_grad()
def generate(model, inputs=None, generation_config=None, logits_processor=None,
             stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus=None,
             assistant_model=None, streamer=None, negative_prompt_ids=None,
             negative_prompt_attention_mask=None, custom_generate=None, **kwargs):
    """Generate like ``model.generate`` (greedy or sampling) with the fused sampler.

    The signature is transformers' ``GenerationMixin.generate``, positional order included, so
    ``patch(model)`` then ``model.generate(ids, GenerationConfig(...))`` works.

    Parameters
    ----------
    model : transformers decoder-only model (``AutoModelForCausalLM``)
    inputs : LongTensor [B, L], optional
        Left-padded prompts (also accepted as ``input_ids=``; ``None`` starts from
        ``bos_token_id``, or from ``inputs_embeds`` when given, as transformers does).
    generation_config, logits_processor, stopping_criteria, streamer
        As in transformers (user processors / criteria are merged by its rules).
    prefix_allowed_tokens_fn, assistant_model, negative_prompt_ids,
    negative_prompt_attention_mask, custom_generate, synced_gpus=True
        Refused with NotImplementedError naming the argument.
    **kwargs
        Model inputs: ``attention_mask`` [B, L], ``past_key_values`` (a transformers ``Cache``:
        ``DynamicCache``, ``StaticCache`` or :class:`StaticKVCache`; continues from it),
        ``inputs_embeds`` [B, L, H], ``position_ids``, ``token_type_ids``, ``logits_to_keep``.
        Generation arguments (max_new_tokens, do_sample, temperature, top_k, top_p, min_p,
        repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_new_tokens, eos_token_id,
        num_return_sequences, stop_strings + tokenizer, remove_invalid_values, use_cache,
        cache_implementation, compile_config, return_dict_in_generate, output_scores,
        output_logits, output_attentions, output_hidden_states, ...), plus extras transformers
        lacks: ``presence_penalty`` / ``frequency_penalty`` (float, OpenAI semantics over
        generated tokens), ``seed`` (int: row b uses seed + b; or LongTensor
        [B * num_return_sequences]) which makes each row's draws a function of (seed, position)
        only, and ``compile`` (bool) to run the decode step through ``torch.compile``;
        contrastive decoding: ``amateur_model`` (a smaller causal LM with the same vocabulary,
        run on its own static cache) with ``cd_alpha`` / ``cd_beta`` (see
        ``gpu_sampler.contrastive``): processors, warpers and the draw act on the contrastive
        scores, which are also what ``logits`` reports.

    Returns
    -------
    LongTensor [B * num_return_sequences, L + steps] like transformers, or a
    ``GenerateDecoderOnlyOutput`` when ``return_dict_in_generate=True``: ``sequences``,
    ``scores`` (processed float32 [B, V] per step), ``logits`` (raw float32 [B, V] per step),
    ``attentions`` / ``hidden_states`` (per step, the model's tuples, shaped as transformers
    returns them) and ``past_key_values`` (a ``DynamicCache`` by default, the ``StaticCache``
    for ``cache_implementation="static"``, the passed cache when one was given).

    Raises ``Unsupported`` (a NotImplementedError; ``.feature`` names it) for any argument or
    model it does not support (assisted decoding, encoder-decoder models, ...), before any side
    effect, and ValueError for invalid arguments, like transformers.

    Example
    -------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from gpu_sampler import generate
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                          num_attention_heads=4, intermediate_size=64)).eval()
    >>> ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    >>> out = generate(model, ids, max_new_tokens=4, do_sample=True, temperature=0.7, seed=0)
    >>> out.shape
    torch.Size([2, 7])
    """
    if seq2seq.supports(model):  # encoder-decoder models: their own loop (hf/seq2seq.py)
        return seq2seq.generate(
            model, inputs, generation_config, logits_processor, stopping_criteria,
            prefix_allowed_tokens_fn, synced_gpus, assistant_model, streamer, negative_prompt_ids,
            negative_prompt_attention_mask, custom_generate, **kwargs)
    _refuse_arguments(prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
                      assistant_model=assistant_model, negative_prompt_ids=negative_prompt_ids,
                      negative_prompt_attention_mask=negative_prompt_attention_mask,
                      custom_generate=custom_generate, synced_gpus=synced_gpus)
    extras = _pop_extras(kwargs)
    extras.contrastive = pop_generate_args(model, kwargs)  # amateur_model, cd_alpha, cd_beta
    run = _resolve_config(model, generation_config, kwargs)
    # Decoding strategies other than greedy / sampling (beam search, contrastive search) branch
    # off here, on the resolved `run.gc`, before the refusal below.
    _refuse_unsupported(run.gc, run.model_kwargs)
    beams = (run.gc.num_beams or 1) > 1
    if beams and streamer is not None and not run.gc.do_sample:
        raise ValueError("`streamer` cannot be used with beam search (yet!). Make sure that "
                         "`num_beams` is set to 1.")
    _prepare_inputs(model, run, inputs)
    if beams:
        _refuse_beam_options(run, extras)
    else:
        _plan_step(model, run, logits_processor, stopping_criteria, extras)
    # Fed only now: every refusal (Unsupported) comes before the first side effect.
    if streamer is not None:
        streamer.put(run.input_ids.cpu())
    if beams:
        return _beam_search(model, run, logits_processor, stopping_criteria, extras)
    state = _allocate(model, run)
    return _decode(model, run, state, streamer)


def _refuse_arguments(synced_gpus, **named):
    for name, value in named.items():
        if value is not None:
            raise Unsupported(f"`{name}`")
    if synced_gpus:
        raise Unsupported("`synced_gpus=True`")


def _pop_extras(kwargs):
    """Remove and validate the arguments transformers' generate does not have."""
    for name in _UNSUPPORTED_ARGS:
        if kwargs.pop(name, None) is not None:
            raise Unsupported(f"`{name}`")
    return types.SimpleNamespace(
        presence=_check_extra("presence_penalty", kwargs.pop("presence_penalty", 0.0)),
        frequency=_check_extra("frequency_penalty", kwargs.pop("frequency_penalty", 0.0)),
        seed=kwargs.pop("seed", None),
        compile=bool(kwargs.pop("compile", False)),
        tokenizer=kwargs.pop("tokenizer", None))


def _resolve_config(model, generation_config, kwargs):
    """transformers' config priority: kwargs > generation_config > the model's defaults."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise Unsupported("encoder-decoder models",
                          "gpu_sampler.generate supports decoder-only models only")
    if not model._supports_default_dynamic_cache():
        raise Unsupported(f"{type(model).__name__} (its cache is not a transformers key/value "
                          f"Cache)")
    defaults = model.generation_config
    has_default_max = (kwargs.get("max_length") is None and (
        generation_config is None or generation_config.max_length is None)
        and defaults.max_length is None)
    has_default_min = (kwargs.get("min_length") is None and (
        generation_config is None or generation_config.min_length is None)
        and defaults.min_length is None)
    compat.take_cache(model, kwargs)
    gc, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    model._validate_model_kwargs(model_kwargs.copy())
    return types.SimpleNamespace(gc=gc, model_kwargs=model_kwargs,
                                 has_default_max=has_default_max, has_default_min=has_default_min)


def _refuse_unsupported(gc, model_kwargs):
    for name, bad in _UNSUPPORTED_CONFIG:
        value = getattr(gc, name, None)
        if bad(value):
            raise Unsupported(f"`{name}`", f"gpu_sampler.generate does not support "
                                           f"`{name}`={value!r}")
    other = sorted(k for k, v in model_kwargs.items()
                   if k not in _MODEL_INPUTS and k != "attention_mask" and v is not None)
    if other:
        raise Unsupported(f"the model arguments {other}")


def _check_prompt(input_ids):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a 2-D LongTensor [batch, length], got "
                         f"{getattr(input_ids, 'shape', type(input_ids))}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one "
                         f"prompt token per row (e.g. the bos token)")
    if input_ids.dtype.is_floating_point:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")


def _prepare_inputs(model, run, inputs):
    """Prompt, mask, positions and lengths, as transformers' generate prepares them.

    Two coordinate systems: `out` holds the returned sequences (input_ids + new tokens, L0
    prompt columns), the model sees kv positions (P prompt positions: inputs_embeds or ids,
    plus whatever a passed cache already holds).
    """
    gc, mk = run.gc, run.model_kwargs
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
    input_ids = inputs_tensor if input_name == "input_ids" else mk.pop("input_ids")
    input_ids = input_ids.to(device=device, dtype=torch.long)
    if input_name == "inputs_embeds":
        gc.use_cache = True  # transformers: embeddings are only consumed with a cache

    expand = max(gc.num_beams or 1, gc.num_return_sequences or 1)
    input_ids, mk = model._expand_inputs_for_generation(input_ids=input_ids, expand_size=expand,
                                                         **mk)
    L0 = input_ids.shape[1]
    gc = model._prepare_generated_length(gc, run.has_default_max, run.has_default_min,
                                         input_name, inputs_tensor=inputs_tensor,
                                         input_ids_length=L0)
    model._validate_generated_length(gc, L0, run.has_default_max)

    cache = compat.pop_cache(mk)
    if cache is not None:
        if gc.cache_implementation is not None:
            raise ValueError("Passing both `cache_implementation` and `past_key_values` (a Cache "
                             "object) is unsupported. Please use only one of the two.")
        if not isinstance(cache, Cache):
            raise ValueError(f"past_key_values must be a transformers Cache (DynamicCache, "
                             f"StaticCache, StaticKVCache), got {type(cache).__name__}")
    # int(): transformers' StaticCache returns its live position counter (a tensor).
    past = int(cache.get_seq_length()) if cache is not None else 0
    embeds = mk.pop("inputs_embeds", None)
    mask = mk.pop("attention_mask")
    if embeds is not None:
        new = embeds.shape[1] - past
    elif mask.shape[1] == L0:
        new = L0 - past   # the full sequence was passed: feed what the cache lacks
    else:
        new = L0          # only the new tokens were passed, the mask covers the cache too
    if new <= 0:
        raise ValueError(f"past_key_values already holds {past} positions, the input has none "
                         f"beyond them: pass the cached sequence plus new tokens")
    P = past + new
    if mask.shape[1] != P:
        raise ValueError(f"attention_mask has {mask.shape[1]} positions but the prompt (with "
                         f"past_key_values) has {P}")
    if embeds is None and new > L0:
        raise ValueError(f"input_ids has {L0} tokens, fewer than the {new} to feed")
    run.gc, run.model_kwargs = gc, mk
    run.input_ids, run.embeds, run.mask, run.cache = input_ids, embeds, mask, cache
    run.device, run.B, run.L0, run.P = device, input_ids.shape[0], L0, P
    run.past, run.new = past, new
    run.B0 = inputs_tensor.shape[0]
    run.max_new = gc.max_length - L0
    # Positions the model will hold at the end (the last token is never fed), as transformers
    # sizes max_cache_length.
    run.kv_total = max(P + run.max_new - 1, P)


def _processors(model, run, logits_processor):
    """transformers' processor list for this call (user processors merged by its rules)."""
    user_lp = list(logits_processor or [])
    procs = model._get_logits_processor(
        generation_config=run.gc, input_ids_seq_length=run.L0, encoder_input_ids=run.input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=lp.LogitsProcessorList(user_lp),
        device=run.device, model_kwargs={"attention_mask": run.mask})
    return procs, user_lp


def _refuse_beam_options(run, extras):
    unsupported = [name for name, on in (
        ("presence_penalty", extras.presence), ("frequency_penalty", extras.frequency),
        ("compile", extras.compile), ("amateur_model", extras.contrastive is not None),
        ("past_key_values", run.cache is not None)) if on]
    if unsupported:
        raise Unsupported(f"{unsupported} with num_beams > 1")


def _beam_search(model, run, logits_processor, stopping_criteria, extras):
    """num_beams > 1: gpu_sampler.hf.beam_search's loop on the prepared (beam-expanded)
    inputs."""
    from .beam_search import beam_search
    procs, user_lp = _processors(model, run, logits_processor)
    mk = run.model_kwargs
    return beam_search(model, run.input_ids, run.mask, run.gc, procs, user_lp, stopping_criteria,
                       extras.tokenizer, seed=extras.seed, position_ids=mk["position_ids"],
                       token_type_ids=mk.get("token_type_ids"), inputs_embeds=run.embeds)


def _plan_step(model, run, logits_processor, stopping_criteria, extras):
    """Processors, stopping criteria and the fused sample() arguments."""
    gc, B, device = run.gc, run.B, run.device
    procs, user_lp = _processors(model, run, logits_processor)
    run.do_sample = bool(gc.do_sample)
    run.torch_procs, fused = _plan_processors(procs, user_lp, run.do_sample)

    user_sc = list(stopping_criteria or [])
    crit = model._get_stopping_criteria(gc, sc.StoppingCriteriaList(user_sc), extras.tokenizer)
    run.has_eos = any(hasattr(c, "eos_token_id") for c in crit)
    # The loop bound and the on-device EOS test replace the built length / EOS criteria.
    run.host_crit = sc.StoppingCriteriaList(
        c for c in crit if is_in(c, user_sc)
        or not isinstance(c, (sc.MaxLengthCriteria, sc.EosTokenCriteria)))
    run.eos, run.pad = gc._eos_token_tensor, gc._pad_token_tensor
    if run.has_eos and run.pad is None:
        raise ValueError("eos_token_id is set but pad_token_id is None: set pad_token_id")

    sample_kw = dict(fused)
    sample_kw.setdefault("repetition_penalty", 1.0)
    sample_kw["presence_penalty"] = extras.presence
    sample_kw["frequency_penalty"] = extras.frequency
    run.ref_kw = dict(sample_kw)
    run.seed = extras.seed
    if extras.seed is not None:
        sample_kw["seed"] = sampling_params.row_seeds(extras.seed, B, device)
    run.sample_kw = sample_kw
    run.compile = extras.compile
    run.contrastive = extras.contrastive
    if run.contrastive is not None and (run.embeds is not None or run.past):
        raise Unsupported("amateur_model with inputs_embeds or a filled past_key_values",
                          "contrastive decoding (amateur_model) takes input_ids only: not "
                          "inputs_embeds or a filled past_key_values")

    rd = bool(gc.return_dict_in_generate)
    run.want_scores = rd and bool(gc.output_scores)
    run.want_logits = rd and bool(gc.output_logits)
    # Contrastive scores go straight into sample()'s launches (amateur_logits) unless a
    # torch-side processor or a returned tensor needs them materialised.
    run.fuse_cd = run.contrastive is not None and not (
        len(run.torch_procs) or run.want_scores or run.want_logits)
    run.want_attn = rd and bool(gc.output_attentions)
    run.want_hidden = rd and bool(gc.output_hidden_states)
    params = inspect.signature(model.forward).parameters
    run.cache_arg = compat.cache_arg(model)
    run.takes_mask = "attention_mask" in params
    run.takes_pos = "position_ids" in params
    mk = run.model_kwargs
    run.logits_to_keep = mk.get("logits_to_keep", 1 if "logits_to_keep" in params else None)
    run.token_type_ids = mk.get("token_type_ids")


def _own_cache(model, B, length):
    """Our StaticKVCache for `length` positions, or None where it refuses the model's config."""
    try:
        return StaticKVCache(model.config, B, length)
    except (ValueError, NotImplementedError):  # layer types it does not hold: DynamicCache
        return None


def _grow_cache(model, cache, B, length):
    """The cache with room for `length` positions, contents kept (cache.grow when it has one)."""
    if hasattr(cache, "grow"):
        cache.grow(length)
        return cache
    bigger = StaticKVCache(model.config, B, length)
    for old, new in zip(cache.layers, bigger.layers):
        if old.is_initialized:
            n = old.get_seq_length()
            new.update(old.keys[:B, :, :n], old.values[:B, :, :n])
    return bigger


def _grow_rows(buf, length, fill):
    bigger = buf.new_full((buf.shape[0], length), fill)
    bigger[:, :buf.shape[1]] = buf
    return bigger


def _allocate(model, run):
    """The working cache and the token / history / mask / position buffers.

    Our own cache and the buffers start with room for _INITIAL_NEW_POSITIONS new tokens and
    double between steps when full (never per token), so a huge max_new_tokens used as "no
    limit" costs memory only for what is generated.
    """
    gc, B, device = run.gc, run.B, run.device
    st = types.SimpleNamespace(own=False, cache=run.cache)
    kv_cap = min(run.kv_total, run.P + _INITIAL_NEW_POSITIONS)
    if run.cache is None and gc.use_cache is not False:
        if gc.cache_implementation not in (None, "dynamic"):
            # transformers' own cache for this implementation ("static", ...): same type,
            # same (sticky) length as model.generate would use.
            made = {}
            model._prepare_cache_for_generation(gc, made, None, run.B0, run.kv_total)
            st.cache = compat.pop_cache(made)
        else:
            # Our cache stands in for transformers' DynamicCache and is converted at the end
            # when returned; sliding layers keep only a window, so then run on the real type.
            # Built lazily, so checking the config at the final length allocates nothing.
            # Returned attention weights must span the written positions only, as with a
            # DynamicCache (padding rows' uniform weights depend on the span): run on one.
            full = None if run.want_attn else _own_cache(model, B, run.kv_total)
            if full is None or (gc.return_dict_in_generate and any(full.is_sliding)):
                st.cache = DynamicCache(config=model.config)
            else:
                st.cache, st.own = _own_cache(model, B, kv_cap), True
    if st.own:
        st.cache_cap = kv_cap
    elif st.cache is not None and st.cache.is_compileable and st.cache.get_max_length() > 0:
        fixed = st.cache.get_max_length()
        if not any(st.cache.is_sliding) and fixed < run.kv_total:
            raise ValueError(f"past_key_values holds at most {fixed} positions but this call "
                             f"needs {run.kv_total} (max_length {gc.max_length})")
        kv_cap = max(kv_cap, fixed)
    st.kv = run.past                     # positions the cache holds
    st.mask = run.mask.new_ones(B, kv_cap)
    st.mask[:, :run.P] = run.mask
    st.pos = torch.zeros(B, kv_cap, dtype=torch.long, device=device)
    pos = run.model_kwargs["position_ids"]
    k = min(run.P, pos.shape[1])
    st.pos[:, run.P - k:run.P] = pos[:, pos.shape[1] - k:]
    st.next_pos = pos[:, -1] + 1
    tt = run.token_type_ids
    st.tt = None
    if tt is not None:
        # transformers repeats the last token type for every generated token.
        st.tt_last = tt[:, -1:]
        st.tt = st.tt_last.expand(B, kv_cap).contiguous()
        k = min(run.P, tt.shape[1])
        st.tt[:, run.P - k:run.P] = tt[:, tt.shape[1] - k:]
    seq_cap = min(run.gc.max_length, run.L0 + _INITIAL_NEW_POSITIONS)
    st.out = torch.empty(B, seq_cap, dtype=torch.long, device=device)
    st.out[:, :run.L0] = run.input_ids
    # Penalty history: left padding (before the first attended token, like transformers'
    # prompt_ignore_length) and not-yet-generated slots are -1, which sample() ignores.
    st.hist = torch.full((B, seq_cap), -1, dtype=torch.long, device=device)
    if run.L0:
        pad = prompt_history_mask(run.mask[:, run.P - run.L0:], run.L0)
        st.hist[:, :run.L0] = run.input_ids.masked_fill(pad, -1)
    st.step = _make_step(model, run, st)
    _set_fixed_inputs(run, st)
    st.amateur_cache = None
    if run.contrastive is not None and st.cache is not None:
        # The amateur runs on its own static cache, as long as the mask buffer (grown with it).
        st.amateur_cache = _own_cache(run.contrastive[0], B, st.mask.shape[1]) or DynamicCache(
            config=run.contrastive[0].config)
    return st


def _ensure_room(model, run, st, kv_need, seq_need):
    """Double the buffers (and our cache) that cannot hold the next step; between steps only."""
    if st.own and kv_need > st.cache_cap:
        st.cache_cap = min(run.kv_total, max(kv_need, 2 * st.cache_cap))
        st.cache = _grow_cache(model, st.cache, run.B, st.cache_cap)
        _set_fixed_inputs(run, st)
        _mark_static(run, st)
    kv_cap = max(kv_need, st.cache_cap if st.own else 0)
    if kv_cap > st.mask.shape[1]:
        kv_cap = max(kv_cap, min(2 * st.mask.shape[1], max(run.kv_total, kv_need)))
        st.mask = _grow_rows(st.mask, kv_cap, 1)
        if isinstance(st.amateur_cache, StaticKVCache):
            st.amateur_cache.grow(kv_cap)
        st.pos = _grow_rows(st.pos, kv_cap, 0)
        if st.tt is not None:
            width = st.tt.shape[1]
            st.tt = _grow_rows(st.tt, kv_cap, 0)
            st.tt[:, width:] = st.tt_last
        _mark_static(run, st)
    if seq_need > st.out.shape[1]:
        cap = min(run.gc.max_length, max(seq_need, 2 * st.out.shape[1]))
        st.out = _grow_rows(st.out, cap, 0)
        st.hist = _grow_rows(st.hist, cap, -1)


def _mark_static(run, st):
    if not run.compile:
        return
    # The buffers are mutated in place by every step: a fixed address lets CUDA graphs
    # replay instead of being skipped for mutated inputs.
    if st.own:
        for layer in st.cache.layers:
            if layer.is_initialized:
                torch._dynamo.mark_static_address(layer.keys)
                torch._dynamo.mark_static_address(layer.values)
    torch._dynamo.mark_static_address(st.mask)


def _make_step(model, run, st):
    """The decode-step callable: (model inputs) -> (last logits, attentions, hidden states)."""
    call = model
    nominal = None if st.own else st.cache  # transformers would compile only a static cache
    if not run.compile and nominal is not None and model._valid_auto_compile_criteria(
            compat.cache_entry(nominal), run.gc):
        call = model.get_compiled_call(run.gc.compile_config)
    want_attn, want_hidden = run.want_attn, run.want_hidden

    def step(kw):
        o = call(**kw)
        return (o.logits[:, -1, :], o.attentions if want_attn else None,
                o.hidden_states if want_hidden else None)

    if run.compile:
        if run.device.type == "cuda":
            return torch.compile(step, mode="reduce-overhead")
        return torch.compile(step, fullgraph=False)
    return step


def _model_inputs(run, st, q, ids=None, embeds=None):
    """Keyword arguments for one forward over `q` new positions starting at st.kv."""
    kw = dict(st.fixed_kw)
    if embeds is not None:
        kw["inputs_embeds"] = embeds
    else:
        kw["input_ids"] = ids
    start = st.kv
    if st.cache is None:
        start, q = 0, st.kv + q  # no cache: the whole sequence every step
    end = start + q
    if run.takes_mask:
        kw["attention_mask"] = st.mask[:, :max(end, st.static_len)]
    if run.takes_pos:
        kw["position_ids"] = st.pos[:, start:end]
    if st.tt is not None:
        kw["token_type_ids"] = st.tt[:, start:end]
    return kw


def _set_fixed_inputs(run, st):
    """The forward arguments that change only when the cache is replaced (growth)."""
    kw = {"use_cache": st.cache is not None}
    if st.cache is not None:
        kw[run.cache_arg] = st.cache
    if run.logits_to_keep is not None:
        kw["logits_to_keep"] = run.logits_to_keep
    if run.want_attn:
        kw["output_attentions"] = True
    if run.want_hidden:
        kw["output_hidden_states"] = True
    st.fixed_kw = kw
    # A static cache attends over its whole length: the 2-D mask must be that long (ALiBi
    # models build their bias from it); unwritten slots are 1 and hidden by causality.
    static = st.cache is not None and st.cache.is_compileable
    st.static_len = st.cache.get_max_length() if static else 0


def _prefill(model, run, st):
    new = run.new
    if run.embeds is not None:
        kw = _model_inputs(run, st, new, embeds=run.embeds[:, -new:])
    else:
        ids = run.input_ids[:, -new:] if st.cache is not None else run.input_ids
        kw = _model_inputs(run, st, new, ids=ids)
    o = model(**kw)
    res = (_contrastive_logits(run, st, kw, o.logits[:, -1, :]),
           o.attentions if run.want_attn else None,
           o.hidden_states if run.want_hidden else None)
    st.kv += new
    if run.compile:
        _mark_static(run, st)
    return res


def _decode(model, run, st, streamer):
    """Prefill, then one sample() per step until every row stops or max_length is reached."""
    B, L0, device = run.B, run.L0, run.device
    logits, attn, hidden = _prefill(model, run, st)
    logits = logits.to(torch.float32, copy=True)
    all_scores, all_logits, all_attn, all_hidden = [], [], [], []
    unfinished = torch.ones(B, dtype=torch.bool, device=device)
    invalid = torch.zeros(B, dtype=torch.bool, device=device)
    steps_run = torch.zeros((), dtype=torch.long, device=device)
    # A cache handed back as is must not hold positions of steps past the stop.
    returns_cache = not st.own and st.cache is not None and (
        run.cache is not None or run.gc.return_dict_in_generate)
    sync_every_step = streamer is not None or len(run.host_crit) > 0 or returns_cache
    sample_kw = run.sample_kw

    for i in range(run.max_new):
        cur = L0 + i
        _record(run, st, all_attn, all_hidden, attn, hidden)
        scores = logits
        if run.want_logits:
            all_logits.append(logits.clone())
        if len(run.torch_procs):
            scores = run.torch_procs(st.out[:, :cur], scores)
        if run.want_scores:
            all_scores.append(processed_logits_reference(
                scores, input_ids=st.hist, prompt_lens=L0, **run.ref_kw))
        if run.seed is not None:
            # A row's draw depends only on (its seed, its position): batch-independent.
            sample_kw["offset"] = st.next_pos
        tok = sample(scores, input_ids=st.hist, prompt_lens=L0, check=False, **sample_kw,
                     **_cd_sample_kw(run, st))
        invalid |= unfinished & (tok < 0)
        # An invalid row (-1) must not reach the embedding before the next check raises.
        tok = tok.clamp_min(0)
        if run.has_eos:
            tok = torch.where(unfinished, tok, run.pad)
        st.out[:, cur] = tok
        st.hist[:, cur] = tok
        steps_run += unfinished.any()
        if streamer is not None:
            streamer.put(tok.cpu())
        if run.has_eos:
            unfinished &= ~torch.isin(tok, run.eos)
        if len(run.host_crit):
            unfinished &= ~run.host_crit(st.out[:, :cur + 1], scores).to(device)
        if i == run.max_new - 1:
            break
        if sync_every_step or (i + 1) % _CHECK_EVERY == 0:
            _raise_if_invalid(invalid)
            if not bool(unfinished.any()):
                break
        _ensure_room(model, run, st, st.kv + 1, cur + 2)
        if st.cache is None:
            st.pos[:, st.kv] = st.next_pos
            kw = _model_inputs(run, st, 1, ids=st.out[:, :cur + 1])
        else:
            kw = _model_inputs(run, st, 1, ids=tok[:, None])
            if run.takes_pos:
                kw["position_ids"] = st.next_pos[:, None]
        logits, attn, hidden = st.step(kw)
        logits = _contrastive_logits(run, st, kw, logits).to(torch.float32, copy=True)
        st.kv += 1
        st.next_pos = st.next_pos + 1

    _raise_if_invalid(invalid)
    n = int(steps_run)
    sequences = st.out[:, :L0 + n]
    if streamer is not None:
        streamer.end()
    if not run.gc.return_dict_in_generate:
        return sequences
    return compat.make_output(
        GenerateDecoderOnlyOutput, _returned_cache(model, run, st, run.P + n - 1),
        sequences=sequences,
        scores=tuple(all_scores[:n]) if run.want_scores else None,
        logits=tuple(all_logits[:n]) if run.want_logits else None,
        attentions=tuple(all_attn[:n]) if run.want_attn else None,
        hidden_states=tuple(all_hidden[:n]) if run.want_hidden else None)


def _contrastive_logits(run, st, kw, logits):
    """With an amateur model: the contrastive scores of `logits` against the amateur's logits
    for the same inputs (issue 10); the processors, warpers and draw then act on them. With
    ``run.fuse_cd`` the expert logits come back unchanged and the amateur's are kept for
    sample(), which computes the same scores inside its own launches."""
    if run.contrastive is None:
        return logits
    amateur, alpha, beta = run.contrastive
    params = inspect.signature(amateur.forward).parameters
    akw = {k: v for k, v in kw.items() if k in params and k not in (
        compat.OLD, compat.NEW, "output_attentions", "output_hidden_states",
        "logits_to_keep")}
    if "logits_to_keep" in params:
        akw["logits_to_keep"] = 1
    cache = st.amateur_cache
    if cache is not None:
        akw[compat.cache_arg(amateur)] = cache
        if "attention_mask" in akw:
            q = kw["input_ids"].shape[1]
            n = cache.attention_mask_length(q) if hasattr(cache, "attention_mask_length") \
                else st.kv + q
            akw["attention_mask"] = st.mask[:, :n]
    amateur_logits = amateur(**akw).logits[:, -1, :]
    if run.fuse_cd:
        st.amateur_logits = amateur_logits.to(torch.float32, copy=True)
        return logits
    return contrastive_scores(logits, amateur_logits, cd_alpha=alpha, cd_beta=beta, check=False)


def _cd_sample_kw(run, st):
    """sample()'s contrastive arguments when the scores are fused into its launches."""
    if not run.fuse_cd:
        return {}
    _, alpha, beta = run.contrastive
    return dict(amateur_logits=st.amateur_logits, cd_alpha=alpha, cd_beta=beta)


def _record(run, st, all_attn, all_hidden, attn, hidden):
    if run.want_attn:
        all_attn.append(attn)
    if run.want_hidden:
        all_hidden.append(hidden)


def _returned_cache(model, run, st, length):
    """What transformers returns as past_key_values: our stand-in becomes a DynamicCache."""
    if not st.own:
        return st.cache
    dynamic = DynamicCache(config=model.config)
    for idx, layer in enumerate(st.cache.layers):
        if layer.is_initialized:
            dynamic.update(layer.keys[:run.B, :, :length].clone(),
                           layer.values[:run.B, :, :length].clone(), idx)
    return dynamic


def _raise_if_invalid(invalid):
    if bool(invalid.any()):
        rows = invalid.nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} have no valid token to sample (NaN logits, or every token "
                         f"filtered to -inf by the processors)")
