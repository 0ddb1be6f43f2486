"""Drop-in replacement for ``model.generate`` (greedy and sampling) built on ``sample()``.

Configuration is resolved exactly as transformers 5.x does it (the model's own helpers for
config priority, special tokens, lengths, processors and stopping criteria), then one prefill and
a decode loop run on a :class:`~gpu_sampler.cache.StaticKVCache`. Penalties, temperature,
top-k, top-p, min-p and the draw happen in one ``sample()`` call per step; the -inf mask
processors (no_repeat_ngram, bad_words, min_length) and user processors run in torch first.
"""
import inspect
import types

import torch
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .cache import StaticKVCache
from .reference import processed_logits_reference
from .sampler import sample

__all__ = ["generate", "patch", "unpatch"]

# How often (in decode steps) the loop reads `unfinished.any()` back to the host. Between
# checks no step synchronises; steps run after every row finished are trimmed from the output.
_CHECK_EVERY = 8

# Pure -inf masks: they commute with the repetition penalty (a masked -inf stays -inf).
_MASKS = (lp.NoRepeatNGramLogitsProcessor, lp.NoBadWordsLogitsProcessor,
          lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor)
# Warpers fused into sample(), in transformers' order.
_WARPERS = ((lp.TemperatureLogitsWarper, "temperature"), (lp.TopKLogitsWarper, "top_k"),
            (lp.TopPLogitsWarper, "top_p"), (lp.MinPLogitsWarper, "min_p"))
# transformers processors generate() would build that this loop does not implement, by the
# argument that turns them on.
_UNSUPPORTED_PROCESSORS = {
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "EncoderNoRepeatNGramLogitsProcessor": "encoder_no_repeat_ngram_size",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "TopHLogitsWarper": "top_h",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "LogitNormalization": "renormalize_logits",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
    "WatermarkLogitsProcessor": "watermarking_config",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
}
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
    ("output_attentions", lambda v: bool(v)),
    ("output_hidden_states", lambda v: bool(v)),
    ("cache_implementation", lambda v: v not in (None, "static", "dynamic")),
)
_UNSUPPORTED_ARGS = ("prefix_allowed_tokens_fn", "assistant_model", "negative_prompt_ids",
                     "negative_prompt_attention_mask", "custom_generate", "assistant_tokenizer")


def _is_in(obj, items):
    return any(obj is x for x in items)


def _plan_processors(procs, user, do_sample):
    """Split transformers' processor list into (torch-side list, fused sample() kwargs).

    The fast path fuses the repetition penalty and the trailing warpers; user processors force
    the penalty into torch so it still runs before them, as in transformers.
    """
    for p in procs:
        name = type(p).__name__
        if not _is_in(p, user) and name in _UNSUPPORTED_PROCESSORS:
            raise NotImplementedError(
                f"gpu_sampler.generate does not support `{_UNSUPPORTED_PROCESSORS[name]}` "
                f"({name}); use model.generate for it")
        if not _is_in(p, user) and not isinstance(
                p, _MASKS + (lp.RepetitionPenaltyLogitsProcessor,) + tuple(c for c, _ in _WARPERS)):
            raise NotImplementedError(f"gpu_sampler.generate does not support the logits processor "
                                      f"{name} that the generation config enables")
    fused = {}
    cut = len(procs)
    rank = len(_WARPERS)
    while cut > 0 and do_sample:
        p = procs[cut - 1]
        r = next((i for i, (c, _) in enumerate(_WARPERS) if type(p) is c), None)
        if r is None or r >= rank or _is_in(p, user) or getattr(p, "min_tokens_to_keep", 1) != 1:
            break
        fused[_WARPERS[r][1]] = getattr(p, _WARPERS[r][1])
        rank, cut = r, cut - 1
    head = list(procs[:cut])
    pure = all(isinstance(p, _MASKS) or (type(p) is lp.RepetitionPenaltyLogitsProcessor
                                         and not _is_in(p, user)) for p in head)
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


def _row_seeds(seed, B, device):
    if isinstance(seed, torch.Tensor):
        if seed.dim() != 1 or seed.shape[0] != B or seed.dtype.is_floating_point:
            raise ValueError(f"seed must be an int or an integer tensor of shape [{B}] (one per "
                             f"output row), got shape {tuple(seed.shape)} {seed.dtype}")
        return seed.to(device=device, dtype=torch.int64)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int or a LongTensor of shape [{B}], got {seed!r}")
    # Rows get distinct streams (num_return_sequences copies of a prompt must differ).
    return seed + torch.arange(B, device=device, dtype=torch.int64)


@torch.no_grad()
def generate(model, input_ids=None, attention_mask=None, generation_config=None,
             logits_processor=None, stopping_criteria=None, streamer=None, **kwargs):
    """Generate like ``model.generate`` (greedy or sampling) with the fused sampler.

    Parameters
    ----------
    model : transformers decoder-only model (``AutoModelForCausalLM``)
    input_ids : LongTensor [B, L]
        Left-padded prompts (``None`` starts from ``bos_token_id``, as transformers does).
    attention_mask : LongTensor [B, L], optional
        1 for tokens, 0 for padding; inferred like transformers when omitted.
    generation_config, logits_processor, stopping_criteria, streamer
        As in transformers (user processors / criteria are merged by its rules).
    **kwargs
        Generation arguments (max_new_tokens, do_sample, temperature, top_k, top_p, min_p,
        repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_new_tokens, eos_token_id,
        num_return_sequences, stop_strings + tokenizer, return_dict_in_generate,
        output_scores, output_logits, ...), plus extras transformers lacks:
        ``presence_penalty`` / ``frequency_penalty`` (float, OpenAI semantics over generated
        tokens), ``seed`` (int: row b uses seed + b; or LongTensor [B * num_return_sequences])
        which makes each row's draws a function of (seed, position) only, and ``compile``
        (bool) to run the decode step through ``torch.compile``.

    Returns
    -------
    LongTensor [B * num_return_sequences, L + steps] like transformers, or a
    ``GenerateDecoderOnlyOutput`` with ``sequences``, ``scores`` (processed float32 [B, V] per
    step) and ``logits`` (raw float32 [B, V] per step) when ``return_dict_in_generate=True``.

    Raises NotImplementedError naming any argument it does not support (beam search, assisted
    decoding, ...) and ValueError for invalid arguments, like transformers.

    Example
    -------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from gpu_sampler.generation import generate
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                          num_attention_heads=4, intermediate_size=64)).eval()
    >>> ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    >>> out = generate(model, ids, max_new_tokens=4, do_sample=True, temperature=0.7, seed=0)
    >>> out.shape
    torch.Size([2, 7])
    """
    if "inputs" in kwargs:
        if input_ids is not None:
            raise ValueError("pass the prompt as input_ids or inputs, not both")
        input_ids = kwargs.pop("inputs")
    for name in _UNSUPPORTED_ARGS:
        if kwargs.pop(name, None) is not None:
            raise NotImplementedError(f"gpu_sampler.generate does not support `{name}`")
    if kwargs.pop("synced_gpus", None):
        raise NotImplementedError("gpu_sampler.generate does not support `synced_gpus=True`")
    presence = _check_extra("presence_penalty", kwargs.pop("presence_penalty", 0.0))
    frequency = _check_extra("frequency_penalty", kwargs.pop("frequency_penalty", 0.0))
    seed = kwargs.pop("seed", None)
    use_compile = bool(kwargs.pop("compile", False))
    tokenizer = kwargs.pop("tokenizer", None)
    if getattr(model.config, "is_encoder_decoder", False):
        raise NotImplementedError("gpu_sampler.generate supports decoder-only models only")
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask

    gen_defaults = model.generation_config
    has_default_max_length = (kwargs.get("max_length") is None and (
        generation_config is None or generation_config.max_length is None)
        and gen_defaults.max_length is None)
    has_default_min_length = (kwargs.get("min_length") is None and (
        generation_config is None or generation_config.min_length is None)
        and gen_defaults.min_length is None)
    gc, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    model._validate_model_kwargs(model_kwargs.copy())
    for name, bad in _UNSUPPORTED_CONFIG:
        value = getattr(gc, name, None)
        if bad(value):
            raise NotImplementedError(f"gpu_sampler.generate does not support `{name}`={value!r}")
    attention_mask = model_kwargs.pop("attention_mask", None)
    model_kwargs.pop("use_cache", None)
    if model_kwargs:
        raise NotImplementedError(f"gpu_sampler.generate does not support the model arguments "
                                  f"{sorted(model_kwargs)}")

    # ---- inputs ------------------------------------------------------------------------------
    if input_ids is None:
        if gc.bos_token_id is None:
            raise ValueError("input_ids is None and the generation config has no bos_token_id "
                             "to start from")
        input_ids = torch.full((1, 1), gc.bos_token_id, dtype=torch.long, device=model.device)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a 2-D LongTensor [batch, length], got "
                         f"{getattr(input_ids, 'shape', type(input_ids))}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one "
                         f"prompt token per row (e.g. the bos token)")
    if input_ids.dtype.is_floating_point:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    input_ids = input_ids.to(torch.long)
    device = input_ids.device
    B0 = input_ids.shape[0]
    model._prepare_special_tokens(gc, attention_mask is not None, device=device, batch_size=B0)
    if attention_mask is None:
        attention_mask = model._prepare_attention_mask_for_generation(input_ids, gc, {})
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    attention_mask = attention_mask.to(device)

    nrs = gc.num_return_sequences or 1
    beams = (gc.num_beams or 1) > 1
    if beams and streamer is not None and not gc.do_sample:
        raise ValueError("`streamer` cannot be used with beam search (yet!). Make sure that "
                         "`num_beams` is set to 1.")
    expand = max(gc.num_beams or 1, nrs)
    if expand > 1:
        input_ids = input_ids.repeat_interleave(expand, dim=0)
        attention_mask = attention_mask.repeat_interleave(expand, dim=0)
    B, L = input_ids.shape
    if streamer is not None:
        streamer.put(input_ids.cpu())

    gc = model._prepare_generated_length(gc, has_default_max_length, has_default_min_length,
                                         "input_ids", L, input_ids)
    model._validate_generated_length(gc, L, has_default_max_length)
    max_new = gc.max_length - L

    # ---- processors, criteria ---------------------------------------------------------------
    user_lp = list(logits_processor or [])
    procs = model._get_logits_processor(
        generation_config=gc, input_ids_seq_length=L, encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=lp.LogitsProcessorList(user_lp),
        device=device, model_kwargs={"attention_mask": attention_mask})
    do_sample = bool(gc.do_sample)
    if beams:
        from .beam import beam_search
        if presence or frequency or use_compile:
            raise NotImplementedError("gpu_sampler.generate does not support presence_penalty, "
                                      "frequency_penalty or compile with num_beams > 1")
        return beam_search(model, input_ids, attention_mask, gc, procs, user_lp,
                           stopping_criteria, tokenizer, seed=seed)
    torch_procs, fused = _plan_processors(procs, user_lp, do_sample)

    user_sc = list(stopping_criteria or [])
    crit = model._get_stopping_criteria(gc, sc.StoppingCriteriaList(user_sc), tokenizer)
    has_eos = any(hasattr(c, "eos_token_id") for c in crit)
    # The loop bound and the on-device EOS test replace the built length / EOS criteria.
    host_crit = sc.StoppingCriteriaList(
        c for c in crit if _is_in(c, user_sc)
        or not isinstance(c, (sc.MaxLengthCriteria, sc.EosTokenCriteria)))
    eos = gc._eos_token_tensor
    pad = gc._pad_token_tensor
    if has_eos and pad is None:
        raise ValueError("eos_token_id is set but pad_token_id is None: set pad_token_id")

    sample_kw = dict(fused)
    sample_kw.setdefault("repetition_penalty", 1.0)
    sample_kw["presence_penalty"] = presence
    sample_kw["frequency_penalty"] = frequency
    seed_kw = {} if seed is None else {"seed": _row_seeds(seed, B, device)}
    ref_kw = dict(sample_kw)
    sample_kw.update(seed_kw)

    # ---- buffers -----------------------------------------------------------------------------
    total = gc.max_length
    cache_len = max(total - 1, L)
    cache = StaticKVCache(model.config, B, cache_len)
    out = torch.empty(B, total, dtype=torch.long, device=device)
    out[:, :L] = input_ids
    # Penalty history: left padding (before the first attended token, like transformers'
    # prompt_ignore_length) and not-yet-generated slots are -1, which sample() ignores.
    hist = torch.full((B, total), -1, dtype=torch.long, device=device)
    first = (attention_mask != 0).int().argmax(dim=1)
    keep = torch.arange(L, device=device)[None, :] >= first[:, None]
    hist[:, :L] = torch.where(keep, input_ids, -1)
    # Static-shape decode mask: future slots are hidden by the causal mask, so they can be 1.
    full_mask = torch.ones(B, cache_len, dtype=attention_mask.dtype, device=device)
    full_mask[:, :L] = attention_mask
    position_ids = model._prepare_position_ids_for_generation(
        input_ids, {"attention_mask": attention_mask})
    next_pos = position_ids[:, -1] + 1

    params = inspect.signature(model.forward).parameters
    fwd = {"past_key_values": cache, "use_cache": True}
    if "logits_to_keep" in params:
        fwd["logits_to_keep"] = 1
    takes_mask = "attention_mask" in params
    takes_pos = "position_ids" in params

    def forward(ids, mask, pos):
        kw = dict(fwd)
        if takes_mask:
            kw["attention_mask"] = mask
        if takes_pos:
            kw["position_ids"] = pos
        return model(input_ids=ids, **kw).logits[:, -1, :]

    step = forward
    if use_compile:
        if device.type == "cuda":
            step = torch.compile(forward, mode="reduce-overhead")
        else:
            step = torch.compile(forward, fullgraph=False)

    logits = forward(input_ids, attention_mask, position_ids).to(torch.float32, copy=True)
    if use_compile:
        # The buffers are mutated in place by every step: a fixed address lets CUDA graphs
        # replay instead of being skipped for mutated inputs.
        for layer in cache.layers:
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)
        torch._dynamo.mark_static_address(full_mask)

    want_scores = bool(gc.return_dict_in_generate and gc.output_scores)
    want_logits = bool(gc.return_dict_in_generate and gc.output_logits)
    all_scores, all_logits = [], []
    unfinished = torch.ones(B, dtype=torch.bool, device=device)
    invalid = torch.zeros(B, dtype=torch.bool, device=device)
    steps_run = torch.zeros((), dtype=torch.long, device=device)
    sync_every_step = streamer is not None or len(host_crit) > 0
    prompt_lens = L

    for i in range(max_new):
        cur = L + i
        scores = logits
        if want_logits:
            all_logits.append(logits.clone())
        if len(torch_procs):
            scores = torch_procs(out[:, :cur], scores)
        if want_scores:
            all_scores.append(processed_logits_reference(
                scores, input_ids=hist, prompt_lens=prompt_lens, **ref_kw))
        if seed is not None:
            # A row's draw depends only on (its seed, its position): batch-independent.
            sample_kw["offset"] = next_pos
        tok = sample(scores, input_ids=hist, prompt_lens=prompt_lens, check=False, **sample_kw)
        invalid |= unfinished & (tok < 0)
        # An invalid row (-1) must not reach the embedding before the next check raises.
        tok = tok.clamp_min(0)
        if has_eos:
            tok = torch.where(unfinished, tok, pad)
        out[:, cur] = tok
        hist[:, cur] = tok
        steps_run += unfinished.any()
        if streamer is not None:
            streamer.put(tok.cpu())
        if has_eos:
            unfinished &= ~torch.isin(tok, eos)
        if len(host_crit):
            unfinished &= ~host_crit(out[:, :cur + 1], scores).to(device)
        if i == max_new - 1:
            break
        if sync_every_step or (i + 1) % _CHECK_EVERY == 0:
            _raise_if_invalid(invalid)
            if not bool(unfinished.any()):
                break
        logits = step(tok[:, None], full_mask, next_pos[:, None]).to(torch.float32, copy=True)
        next_pos = next_pos + 1

    _raise_if_invalid(invalid)
    n = int(steps_run)
    sequences = out[:, :L + n]
    if streamer is not None:
        streamer.end()
    if not gc.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(all_scores[:n]) if want_scores else None,
        logits=tuple(all_logits[:n]) if want_logits else None,
        past_key_values=cache)


def _raise_if_invalid(invalid):
    if bool(invalid.any()):
        rows = invalid.nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} have no valid token to sample (NaN logits, or every token "
                         f"filtered to -inf by the processors)")


def _patched_generate(model, *args, **kwargs):
    return generate(model, *args, **kwargs)


def patch(model):
    """Make ``model.generate`` run :func:`generate` (this instance only; see :func:`unpatch`).

    Returns the model. Patching twice is a no-op.

    Example
    -------
    >>> from gpu_sampler.generation import patch, unpatch
    >>> patch(model)            # model.generate(...) now uses gpu_sampler  # doctest: +SKIP
    >>> unpatch(model)          # back to transformers' generate            # doctest: +SKIP
    """
    current = model.__dict__.get("generate")
    if getattr(current, "__func__", None) is _patched_generate:
        return model
    model.__dict__["_gpu_sampler_saved_generate"] = current
    model.__dict__["generate"] = types.MethodType(_patched_generate, model)
    return model


def unpatch(model):
    """Undo :func:`patch`: ``model.generate`` is what it was before. Returns the model."""
    current = model.__dict__.get("generate")
    if getattr(current, "__func__", None) is not _patched_generate:
        return model
    saved = model.__dict__.pop("_gpu_sampler_saved_generate", None)
    if saved is None:
        del model.__dict__["generate"]
    else:
        model.__dict__["generate"] = saved
    return model
