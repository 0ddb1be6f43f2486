"""``generate`` for encoder-decoder models (T5, BART, Marian, Whisper, ...): greedy and sampling.

Mirrors transformers 5.x ``generate`` / ``_sample`` for ``config.is_encoder_decoder`` with its
own helpers: config priority, the encoder input (``input_ids``, ``inputs_embeds`` or the
model's main input, e.g. Whisper's ``input_features``), special
tokens (``decoder_start_token_id``), ``decoder_input_ids`` / ``decoder_attention_mask`` as the
user gives them (the start token prepended where missing), expansion for
``num_return_sequences``, lengths, processors and stopping criteria. The encoder runs once;
the decoder loop runs on transformers' ``EncoderDecoderCache`` whose self-attention part is a
:class:`~gpu_sampler.hf.cache.StaticKVCache` (transformers' ``DynamicCache`` where it refuses
the config, or where returned attention weights must span the written positions only) and
whose cross-attention part the model fills at the first step. Penalties, temperature, top-k,
top-p, min-p and the draw happen in one ``sample()`` call per step.

A passed ``EncoderDecoderCache`` (continuing an earlier call: ``decoder_input_ids`` holding
its sequences) is used as transformers 5.24 uses it: the encoder runs again, the model reads
the cache's filled cross-attention part, the first step feeds the decoder tokens past the
cache when ``decoder_attention_mask`` is as wide as ``decoder_input_ids`` and every decoder
token on top of it otherwise; the cache is written in place and returned (with beams,
reordered after every step, the last included). Refused there: ``use_cache=False``, other
cache types, a cache whose rows are not the decoder's (B x num_beams with beams).

Beam search and beam sampling (``num_beams > 1``) run gpu_sampler.hf.beam_search's loop with
its forward on the decoder. Refused with ``Unsupported`` (before the model runs): models that
override ``generate`` or its input preparation (the overrides the loop
reproduces excepted: :mod:`gpu_sampler.hf.whisper`), other encoder inputs, ``compile`` and
contrastive decoding; with beams also presence / frequency penalties, a streamer and cache
implementations (``use_cache=False`` feeds the whole decoder sequence each step, as
transformers).

Whisper overrides ``generate``: :func:`generate` refuses it, and ``patch(model)`` runs
Whisper's own generate, whose inner ``super().generate`` call comes to
:func:`generate_delegated` (the override already ran; every other hook is still checked).
"""
import copy
import dataclasses
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers.generation.utils import (GenerateBeamEncoderDecoderOutput,
                                           GenerateEncoderDecoderOutput, GenerationMixin)

from .. import params as sampling_params
from ..reference import processed_logits_reference
from ..sampler import sample
from . import compat
from .beam_search import Decoder, beam_search
from .cache import StaticKVCache
from .common import (Unsupported, cache_rows, device_eos, drop_never_forwarded, exact_span,
                     history_skip, is_in, prompt_history_mask, take_passed_cache,
                     whole_max_length)
from .processors import finite_number, plan_processors, refuse_config
from .whisper import decoder_positions, delegates, positions_follow_mask, reproduces_hook


@dataclasses.dataclass(eq=False)
class Extras:
    """The arguments transformers' generate does not have, validated (encoder-decoder)."""
    presence: float
    frequency: float
    seed: Any
    tokenizer: Any


@dataclasses.dataclass(eq=False, slots=True)
class _Run:
    """What one call resolved, filled in order by _resolve_config, _prepare_inputs and
    _plan_step (slots: a step cannot add an undeclared field)."""
    gc: Any
    mk: dict                                  # model kwargs after config resolution
    has_default_max: bool
    has_default_min: bool
    cache: Any = None                         # the caller's EncoderDecoderCache (or None)
    past: int = 0                             # decoder positions the passed cache holds
    kv0: int = 0                              # kv position of the decoder's sequence column 0
    feed: int = 0                             # decoder tokens the first step feeds
    input_ids: Any = None                     # [B, L0] decoder prompt, beam/return-expanded
    input_name: Any = None
    inputs_tensor: Any = None                 # the encoder's input
    encoder_outputs: Any = None
    enc_mask: Any = None                      # encoder attention mask (or None)
    dec_mask: Any = None                      # decoder attention mask [B, L0]
    device: Any = None
    B: int = 0
    B0: int = 0                               # batch before expansion
    L0: int = 0
    expand: int = 1
    max_new: int = 0
    kv_total: int = 0                         # decoder self-attention positions at the end
    procs: Any = None                         # transformers' processor list
    user_lp: Any = None
    user_sc: Any = None
    torch_procs: Any = None                   # the part that runs in torch before sample()
    edits: Any = None                         # single-token processors: sample()'s logit_bias
    sample_kw: Any = None
    ref_kw: Any = None                        # the torch twin's kwargs (output_scores)
    do_sample: bool = False
    seeded: bool = False
    host_crit: Any = None
    has_eos: bool = False
    eos: Any = None
    pad: Any = None
    want_scores: bool = False
    want_logits: bool = False
    want_attn: bool = False
    want_hidden: bool = False
    mask_positions: bool = False              # decoder positions from dec_mask (Whisper)


@dataclasses.dataclass(eq=False, slots=True)
class _State:
    """The decode loop's buffers and cache."""
    own: bool = False                         # the self-attention cache is our StaticKVCache
    cache: Any = None                         # the EncoderDecoderCache (None: use_cache=False)
    self_cache: Any = None
    kv: int = 0                               # self-attention positions written
    cap: int = 0
    mask: Any = None
    out: Any = None
    hist: Any = None
    skip: Any = None                          # [B] history columns before it stay -1, or None
    fixed_kw: Any = None
    static_len: int = 0
    forward: Any = None


@dataclasses.dataclass(eq=False, slots=True)
class _Recorded:
    """The per-step tuples return_dict_in_generate reports."""
    scores: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)
    dec_attn: list = dataclasses.field(default_factory=list)
    cross: list = dataclasses.field(default_factory=list)
    hidden: list = dataclasses.field(default_factory=list)

__all__ = ["generate", "generate_delegated", "supports"]

# Model arguments the loop forwards (or consumes) besides generation arguments and the
# encoder's input (_encoder_inputs).
_MODEL_INPUTS = ("attention_mask", "decoder_attention_mask", "decoder_input_ids",
                 "encoder_outputs", "output_attentions", "output_hidden_states", "use_cache",
                 "logits_to_keep")
# generate() arguments of gpu_sampler that this loop does not implement.
_REFUSED_EXTRAS = ("compile", "amateur_model", "cd_alpha", "cd_beta", "assistant_tokenizer")
# transformers methods a model may override to change what generate feeds it.
_HOOKS = ("generate", "prepare_inputs_for_generation", "_update_model_kwargs_for_generation",
          "_prepare_decoder_input_ids_for_generation", "_sample")
# The same, for the call a model's own generate makes through super().generate: it ran.
_DELEGATED_HOOKS = tuple(h for h in _HOOKS if h != "generate")
_CHECK_EVERY = 8
# Refusals with a passed cache, named once per kind (patch warns once per model and feature).
_UNMATCHED_MASK = "a passed past_key_values with a decoder_attention_mask of another width"
_NOTHING_BEYOND = "a passed past_key_values with no decoder token beyond it"
_OTHER_ROWS = "a passed past_key_values whose rows are not the decoder's"
_OTHER_WIDTH = "a decoder_attention_mask of another width than decoder_input_ids"
_INITIAL_NEW_POSITIONS = 256


def _encoder_inputs(model):
    """The encoder inputs the loop takes. The encoder runs once, through transformers' own
    helper, so the kind of input (Whisper's input_features, ...) does not reach the loop; what
    else transformers reads it for (encoder_repetition_penalty, ...) is refused with the
    processors."""
    return ("input_ids", "inputs_embeds", model.main_input_name)


def supports(model):
    """Whether ``model`` is an encoder-decoder model (its calls go to this module)."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


@torch.no_grad()
def generate(model, inputs=None, generation_config=None, logits_processor=None,
             stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus=None,
             assistant_model=None, streamer=None, negative_prompt_ids=None,
             negative_prompt_attention_mask=None, custom_generate=None, **kwargs):
    """Like ``model.generate`` on an encoder-decoder model (greedy or sampling).

    ``inputs`` / ``input_ids`` (or ``inputs_embeds``) feed the encoder, with ``attention_mask``
    (not inferred from padding when missing, as transformers); ``decoder_input_ids`` /
    ``decoder_attention_mask`` optionally start the decoder; ``past_key_values`` / ``cache``
    (an ``EncoderDecoderCache``) continues from it, written in place. Generation arguments as in
    transformers, plus ``presence_penalty``, ``frequency_penalty`` and ``seed`` (row b draws
    from seed + b at each decoder position: reproducible and batch-independent).

    Returns LongTensor [B * num_return_sequences, L_dec + steps] (the decoder sequences), or a
    ``GenerateEncoderDecoderOutput`` with ``return_dict_in_generate=True`` (scores, logits,
    encoder / decoder / cross attentions, hidden states and the ``EncoderDecoderCache`` as
    transformers returns them).
    """
    _refuse_model(model, _HOOKS)
    return _generate(model, inputs, generation_config, logits_processor, stopping_criteria,
                     prefix_allowed_tokens_fn, synced_gpus, assistant_model, streamer,
                     negative_prompt_ids, negative_prompt_attention_mask, custom_generate,
                     **kwargs)


@torch.no_grad()
def generate_delegated(model, *args, **kwargs):
    """:func:`generate` for the call a model's own ``generate`` makes through
    ``super().generate(...)`` (Whisper's, under ``patch(model)``): same arguments and result.

    The model's override of ``generate`` already prepared this call, so it is not refused; its
    other overrides of transformers' generation hooks are, unless the loop reproduces them.
    """
    _refuse_model(model, _DELEGATED_HOOKS)
    return _generate(model, *args, **kwargs)


def _generate(model, inputs=None, generation_config=None, logits_processor=None,
              stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus=None,
              assistant_model=None, streamer=None, negative_prompt_ids=None,
              negative_prompt_attention_mask=None, custom_generate=None, **kwargs):
    for name, value in (("prefix_allowed_tokens_fn", prefix_allowed_tokens_fn),
                        ("assistant_model", assistant_model),
                        ("negative_prompt_ids", negative_prompt_ids),
                        ("negative_prompt_attention_mask", negative_prompt_attention_mask),
                        ("custom_generate", custom_generate)):
        if value is not None:
            raise Unsupported(f"`{name}`")
    if synced_gpus:
        raise Unsupported("`synced_gpus=True`")
    extras = _pop_extras(kwargs)
    run = _resolve_config(model, generation_config, kwargs)
    beams = (run.gc.num_beams or 1) > 1
    if beams:
        _refuse_beam_options(run, extras, streamer)
    _prepare_decoder_inputs(model, run, inputs)
    _plan_step(model, run, logits_processor, stopping_criteria, extras)
    # Every refusal came before this point: now the encoder runs and the streamer is fed.
    _encode(model, run)
    if beams:
        return _beam_search(model, run, extras)
    if streamer is not None:
        streamer.put(run.input_ids.cpu())
    st = _allocate(model, run)
    return _decode(model, run, st, streamer)


def _refuse_model(model, hooks):
    for hook in hooks:
        mine = getattr(type(model), hook, None)
        if mine is not None and mine is not getattr(GenerationMixin, hook, None) \
                and not reproduces_hook(model, hook):
            hint = "; gpu_sampler.patch(model) runs it around gpu_sampler's loop" if (
                hook == "generate" and delegates(model)) else ""
            raise Unsupported(f"{type(model).__name__} (it overrides {hook})",
                              f"gpu_sampler.generate does not support {type(model).__name__}: "
                              f"it overrides transformers' {hook}{hint}")


def _pop_extras(kwargs):
    for name in _REFUSED_EXTRAS:
        if kwargs.get(name) not in (None, False):
            raise Unsupported(f"`{name}` with encoder-decoder models")
        kwargs.pop(name, None)
    return Extras(
        presence=finite_number("presence_penalty", kwargs.pop("presence_penalty", 0.0)),
        frequency=finite_number("frequency_penalty", kwargs.pop("frequency_penalty", 0.0)),
        seed=kwargs.pop("seed", None), tokenizer=kwargs.pop("tokenizer", None))


def _resolve_config(model, generation_config, kwargs):
    """transformers' config priority, then the refusals that need only the config."""
    gc, mk, has_default_max, has_default_min = compat.transformers_config(
        model, generation_config, kwargs)
    refuse_config(gc)
    if gc.cache_implementation not in (None, "dynamic", "static"):
        raise Unsupported(f"cache_implementation={gc.cache_implementation!r} on "
                          f"encoder-decoder models")
    cache = _passed_cache(gc, mk)
    drop_never_forwarded(mk)
    other = sorted(k for k, v in mk.items() if v is not None
                   and k not in _MODEL_INPUTS + _encoder_inputs(model))
    if other:
        raise Unsupported(f"the model arguments {other}")
    return _Run(gc=gc, mk=mk, has_default_max=has_default_max, has_default_min=has_default_min,
                cache=cache)


def _passed_cache(gc, mk):
    """The caller's cache, taken out of the model kwargs, with transformers' checks."""
    cache = take_passed_cache(gc, mk)
    if cache is None:
        return None
    # transformers runs these only as far as the model's forward allows (a DynamicCache has no
    # cross-attention part; without use_cache each later step refeeds the whole sequence on
    # top of the cache): its own generate is the reference for them.
    if not isinstance(cache, EncoderDecoderCache):
        raise Unsupported(f"a passed past_key_values of type {type(cache).__name__} on "
                          f"encoder-decoder models (an EncoderDecoderCache runs)")
    if gc.use_cache is False:
        raise Unsupported("a passed past_key_values with use_cache=False on encoder-decoder "
                          "models")
    return cache


def _refuse_beam_options(run, extras, streamer):
    gc = run.gc
    if streamer is not None and not gc.do_sample:
        raise ValueError("`streamer` cannot be used with beam search (yet!). Make sure that "
                         "`num_beams` is set to 1.")
    unsupported = [name for name, on in (
        ("presence_penalty", extras.presence), ("frequency_penalty", extras.frequency),
        ("streamer", streamer is not None),
        ("cache_implementation", gc.cache_implementation not in (None, "dynamic"))) if on]
    if unsupported:
        raise Unsupported(f"{unsupported} with beam search on encoder-decoder models")


def _prepare_decoder_inputs(model, run, inputs):
    """Encoder input, special tokens, decoder prompt (expanded) and lengths, as transformers."""
    gc, mk = run.gc, run.mk
    has_mask = mk.get("attention_mask") is not None
    inputs_tensor, input_name, mk = model._prepare_model_inputs(inputs, gc.bos_token_id, mk)
    if input_name not in _encoder_inputs(model):
        raise Unsupported(f"`{input_name}` (encoder input) on encoder-decoder models")
    device, B0 = inputs_tensor.device, inputs_tensor.shape[0]
    model._prepare_special_tokens(gc, has_mask, device=device, batch_size=B0)
    dec_ids, mk = model._prepare_decoder_input_ids_for_generation(
        batch_size=B0, model_input_name=input_name, model_kwargs=mk,
        decoder_start_token_id=gc._decoder_start_token_tensor, device=device)
    if dec_ids.dim() != 2 or dec_ids.dtype.is_floating_point:
        raise ValueError(f"decoder_input_ids must be a 2-D integer tensor, got "
                         f"{tuple(dec_ids.shape)} {dec_ids.dtype}")
    dec_mask = mk.pop("decoder_attention_mask", None)
    _fed_positions(run, dec_ids, dec_mask)
    run.expand = max(gc.num_beams or 1, gc.num_return_sequences or 1)
    dec_kw = {} if dec_mask is None else {"decoder_attention_mask": dec_mask.to(device)}
    dec_ids, dec_kw = model._expand_inputs_for_generation(
        input_ids=dec_ids.to(device=device, dtype=torch.long), expand_size=run.expand, **dec_kw)
    L0 = dec_ids.shape[1]
    gc = model._prepare_generated_length(gc, run.has_default_max, run.has_default_min,
                                         input_name, inputs_tensor=inputs_tensor,
                                         input_ids_length=L0)
    model._validate_generated_length(gc, L0, run.has_default_max)
    gc = whole_max_length(gc)
    run.gc, run.mk, run.inputs_tensor, run.input_name = gc, mk, inputs_tensor, input_name
    run.input_ids, run.dec_mask = dec_ids, dec_kw.get("decoder_attention_mask")
    run.device, run.B0, run.B, run.L0 = device, B0, dec_ids.shape[0], L0
    run.max_new = gc.max_length - L0
    run.mask_positions = run.dec_mask is not None and positions_follow_mask(model)
    _check_cache_rows(run)
    # Self-attention positions the cache holds at the end (the last token is never fed).
    run.kv_total = run.kv0 + max(L0 + run.max_new - 1, L0)


def _fed_positions(run, dec_ids, dec_mask):
    """How the decoder prompt meets a passed cache, as transformers' _prefill decides: a
    decoder_attention_mask as wide as decoder_input_ids marks them the full sequence (the
    first step feeds what the cache lacks); otherwise every decoder token is fed on top of the
    cache, and the mask (when given) spans the cache too. Sets run.past / feed / kv0."""
    L0 = dec_ids.shape[1]
    run.past = int(run.cache.get_seq_length()) if run.cache is not None else 0
    width = L0 if dec_mask is None else dec_mask.shape[1]
    if dec_mask is not None and (dec_mask.dim() != 2 or dec_mask.shape[0] != dec_ids.shape[0]
                                 or width not in (L0, run.past + L0)):
        shapes = (f"decoder_attention_mask has shape {tuple(dec_mask.shape)}, "
                  f"decoder_input_ids {tuple(dec_ids.shape)}")
        if run.cache is not None:
            # What the model makes of a mask matching neither is its forward's business.
            raise Unsupported(_UNMATCHED_MASK, f"gpu_sampler.generate does not support "
                              f"{_UNMATCHED_MASK}: past_key_values holds {run.past} positions, "
                              f"{shapes}")
        if dec_mask.dim() == 2 and dec_mask.shape[0] == dec_ids.shape[0]:
            # transformers runs it (its forward makes of the mask what it does): patch hands
            # the call over rather than fail where model.generate does not.
            raise Unsupported(_OTHER_WIDTH, f"gpu_sampler.generate does not support "
                              f"{_OTHER_WIDTH}: {shapes}")
        raise ValueError(shapes)
    if dec_mask is not None and width == L0:
        run.feed, run.kv0 = L0 - run.past, 0
    else:
        run.feed, run.kv0 = L0, run.past
    if run.feed <= 0:
        # transformers then slices input_ids[:, -0:], refeeding the whole sequence.
        raise Unsupported(_NOTHING_BEYOND, f"gpu_sampler.generate does not support "
                          f"{_NOTHING_BEYOND}: past_key_values holds {run.past} positions, "
                          f"the decoder sequence {L0} tokens")


def _check_cache_rows(run):
    """A passed cache runs when it holds one row per decoder row: transformers does not
    expand it for num_return_sequences / num_beams (a cache from an earlier beam call holds
    B x num_beams rows), and its forward fails on other counts (that error is transformers' to
    give)."""
    if run.cache is None:
        return
    rows = cache_rows(run.cache.self_attention_cache) or run.B
    if rows != run.B:
        raise Unsupported(_OTHER_ROWS, f"gpu_sampler.generate does not support {_OTHER_ROWS}: "
                          f"past_key_values holds {rows} rows, the decoder {run.B} "
                          f"({run.B0} x {run.expand} for num_return_sequences / num_beams)")


def _plan_step(model, run, logits_processor, stopping_criteria, extras):
    """Processors (transformers' list for enc-dec), criteria and the fused sample() kwargs."""
    gc = run.gc
    user_lp = list(logits_processor or [])
    procs = model._get_logits_processor(
        generation_config=gc, input_ids_seq_length=run.L0, encoder_input_ids=run.inputs_tensor,
        prefix_allowed_tokens_fn=None, logits_processor=lp.LogitsProcessorList(user_lp),
        device=run.device, model_kwargs={"decoder_attention_mask": run.dec_mask,
                                         "attention_mask": run.mk.get("attention_mask")})
    run.do_sample = bool(gc.do_sample)
    run.procs, run.user_lp, run.user_sc = procs, user_lp, stopping_criteria
    run.torch_procs, fused, run.edits = plan_processors(procs, user_lp, run.do_sample)
    user_sc = list(stopping_criteria or [])
    crit = model._get_stopping_criteria(gc, sc.StoppingCriteriaList(user_sc), extras.tokenizer)
    run.has_eos = any(hasattr(c, "eos_token_id") for c in crit)
    # The loop bound and the on-device EOS test replace the built length / EOS criteria.
    run.host_crit = sc.StoppingCriteriaList(
        c for c in crit if is_in(c, user_sc)
        or not isinstance(c, (sc.MaxLengthCriteria, sc.EosTokenCriteria)))
    run.eos, run.pad = device_eos(crit, user_sc), gc._pad_token_tensor
    if run.has_eos and run.pad is None:
        raise ValueError("eos_token_id is set but pad_token_id is None: set pad_token_id")
    sample_kw = dict(fused)
    sample_kw.setdefault("repetition_penalty", 1.0)
    sample_kw["presence_penalty"] = extras.presence
    sample_kw["frequency_penalty"] = extras.frequency
    run.ref_kw = dict(sample_kw)
    run.seeded = extras.seed is not None
    if run.seeded:
        sample_kw["seed"] = sampling_params.row_seeds(extras.seed, run.B, run.device)
    run.sample_kw = sample_kw
    rd = bool(gc.return_dict_in_generate)
    run.want_scores = rd and bool(gc.output_scores)
    run.want_logits = rd and bool(gc.output_logits)
    run.want_attn = rd and bool(gc.output_attentions)
    run.want_hidden = rd and bool(gc.output_hidden_states)


def _encode(model, run):
    """The encoder, once (transformers' helper), then its outputs expanded like the prompt."""
    mk = run.mk
    if mk.get("attention_mask") is not None:
        mk["attention_mask"] = mk["attention_mask"].to(run.device)
    prepare = getattr(model, "_maybe_prepare_encoder_kwargs_for_generation", None) or getattr(
        model, "_prepare_encoder_decoder_kwargs_for_generation")
    if mk.get("encoder_outputs") is None:
        mk = prepare(run.inputs_tensor, mk, run.input_name, run.gc)
    enc = {"encoder_outputs": mk["encoder_outputs"]}
    if mk.get("attention_mask") is not None:
        enc["attention_mask"] = mk["attention_mask"]
    _, enc = model._expand_inputs_for_generation(input_ids=None, expand_size=run.expand,
                                                 is_encoder_decoder=True, **enc)
    run.encoder_outputs, run.enc_mask = enc["encoder_outputs"], enc.get("attention_mask")


def decoder_config(model):
    """The decoder's text config, with the decoder's layer count (T5's num_decoder_layers)."""
    cfg = model.config.get_text_config(decoder=True)
    n = getattr(cfg, "num_decoder_layers", None)
    if n is not None and n != cfg.num_hidden_layers:
        cfg = copy.deepcopy(cfg)
        cfg.num_hidden_layers = n
    return cfg


def _own_cache(model, B, length):
    """Our StaticKVCache for the decoder's self-attention, or None (transformers'
    DynamicCache) where it would not give the DynamicCache's results: layer types it does not
    hold, or a model transformers does not run on a static cache (``_can_compile_fullgraph``
    False: LED, ProphetNet, ... build no causal mask for a one-token step, so a static cache's
    unwritten slots would be attended)."""
    if not getattr(model, "_can_compile_fullgraph", False):
        return None
    try:
        return StaticKVCache(decoder_config(model), B, length, exact_length=exact_span(model))
    except (ValueError, NotImplementedError):  # layer types it does not hold
        return None


def _dynamic_only(run, want_attn):
    """Whether the decoder's self-attention must run on transformers' DynamicCache rather than
    our StaticKVCache: attention weights must span the written positions only, and a decoder
    position the mask pads (left padding) attends to nothing, so the model spreads it evenly
    over every kv slot: its hidden states and cache entries in later layers then depend on the
    cache's width, and return_dict_in_generate hands both back."""
    return want_attn or (bool(run.gc.return_dict_in_generate) and run.dec_mask is not None
                         and not bool(run.dec_mask.all()))


def _allocate(model, run):
    """The working EncoderDecoderCache and the sequence / history / decoder-mask buffers."""
    gc, B, L0 = run.gc, run.B, run.L0
    st = _State()
    cap = min(run.kv_total, L0 + _INITIAL_NEW_POSITIONS)
    if run.cache is not None:
        # The caller's cache: written in place and returned, as transformers does.
        st.cache, st.self_cache = run.cache, run.cache.self_attention_cache
    elif gc.use_cache is not False:
        if gc.cache_implementation == "static":
            made = {"encoder_outputs": run.encoder_outputs}
            model._prepare_cache_for_generation(gc, made, None, run.B0, gc.max_length - 1)
            st.cache = compat.pop_cache(made)
        else:
            mine = None if _dynamic_only(run, run.want_attn) else _own_cache(model, B, cap)
            st.own = mine is not None
            self_cache = mine if st.own else DynamicCache(config=decoder_config(model))
            st.cache = EncoderDecoderCache(self_cache, DynamicCache(config=decoder_config(model)))
        st.self_cache = st.cache.self_attention_cache
    st.cap = cap if st.own else run.kv_total
    static = st.cache is not None and st.cache.is_compileable
    st.static_len = st.cache.get_max_length() if static else 0
    st.mask = None
    if run.dec_mask is not None:
        # Indexed by kv position: the mask spans the passed cache too when it is wider.
        width = run.dec_mask.shape[1]
        st.mask = run.dec_mask.new_ones(B, max(st.cap, st.static_len, width))
        st.mask[:, :width] = run.dec_mask
    seq_cap = min(gc.max_length, L0 + _INITIAL_NEW_POSITIONS)
    st.out = torch.empty(B, seq_cap, dtype=torch.long, device=run.device)
    st.out[:, :L0] = run.input_ids
    # Penalty history: positions before the first attended decoder token (transformers'
    # prompt_ignore_length, from decoder_attention_mask) and unwritten slots are -1.
    st.hist = torch.full((B, seq_cap), -1, dtype=torch.long, device=run.device)
    ids = run.input_ids
    if run.dec_mask is not None:
        ids = ids.masked_fill(prompt_history_mask(run.dec_mask, L0), -1)
        if run.dec_mask.shape[1] > L0:
            # A mask spanning a passed cache: transformers counts its left padding in sequence
            # columns, which may reach past the prompt into the generated tokens.
            st.skip = history_skip((run.dec_mask != 0).int().argmax(dim=1), L0, run.sample_kw)
    st.hist[:, :L0] = ids
    st.fixed_kw = _fixed_inputs(model, run, st)
    st.forward = model
    if st.cache is not None and not st.own and model._valid_auto_compile_criteria(
            compat.cache_entry(st.cache), gc):
        st.forward = model.get_compiled_call(gc.compile_config)
    return st


def _fixed_inputs(model, run, st):
    """The forward arguments every decoder step shares."""
    kw = {"encoder_outputs": run.encoder_outputs, "use_cache": st.cache is not None,
          "return_dict": True}
    if run.enc_mask is not None:
        kw["attention_mask"] = run.enc_mask
    if st.cache is not None:
        kw[compat.cache_arg(model)] = st.cache
    if model._supports_logits_to_keep():
        kw["logits_to_keep"] = run.mk.get("logits_to_keep", 1)
    if run.want_attn:
        kw["output_attentions"] = True
    if run.want_hidden:
        kw["output_hidden_states"] = True
    return kw


def _ensure_room(run, st, kv_need, seq_need):
    """Double our cache, the decoder mask and the sequence buffers when full (between steps)."""
    if st.own and kv_need > st.cap:
        st.cap = min(run.kv_total, max(kv_need, 2 * st.cap))
        st.self_cache.grow(st.cap)
        st.static_len = st.cache.get_max_length()
    if st.mask is not None and max(kv_need, st.static_len) > st.mask.shape[1]:
        width = max(kv_need, st.static_len, min(2 * st.mask.shape[1], run.kv_total))
        bigger = st.mask.new_ones(run.B, width)
        bigger[:, :st.mask.shape[1]] = st.mask
        st.mask = bigger
    if seq_need > st.out.shape[1]:
        cap = min(run.gc.max_length, max(seq_need, 2 * st.out.shape[1]))
        for name, fill in (("out", 0), ("hist", -1)):
            buf = getattr(st, name)
            bigger = buf.new_full((run.B, cap), fill)
            bigger[:, :buf.shape[1]] = buf
            setattr(st, name, bigger)


def _step(run, st, ids, length):
    """One decoder forward over `ids` (the tokens past st.kv; the whole sequence without a
    cache), `length` kv positions after it: (last logits float32, decoder attentions, cross
    attentions, decoder hidden)."""
    kw = dict(st.fixed_kw)
    kw["decoder_input_ids"] = ids
    if st.mask is not None:
        kw["decoder_attention_mask"] = st.mask[:, :max(length, st.static_len)]
    if run.mask_positions:
        kw["decoder_position_ids"] = decoder_positions(st.mask[:, :length], ids.shape[1])
    o = st.forward(**kw)
    logits = o.logits[:, -1, :].to(torch.float32, copy=True)
    return (logits, o.decoder_attentions if run.want_attn else None,
            o.cross_attentions if run.want_attn else None,
            o.decoder_hidden_states if run.want_hidden else None)


def _decode(model, run, st, streamer):
    """The first step over the decoder prompt, then one sample() per step until every row
    stops or max_length is reached."""
    B, L0, device, kv0 = run.B, run.L0, run.device, run.kv0
    step = _step(run, st, run.input_ids[:, L0 - run.feed:], kv0 + L0)
    st.kv = kv0 + L0
    rec = _Recorded()
    unfinished = torch.ones(B, dtype=torch.bool, device=device)
    invalid = torch.zeros(B, dtype=torch.bool, device=device)
    steps_run = torch.zeros((), dtype=torch.long, device=device)
    # A cache handed back as is (or the caller's) must not hold positions of steps past the
    # stop.
    returns_cache = not st.own and st.cache is not None and (
        run.gc.return_dict_in_generate or run.cache is not None)
    # torch-side processors (user ones included) must not see steps transformers never runs.
    sync_every_step = (streamer is not None or len(run.host_crit) > 0 or returns_cache
                       or len(run.torch_procs) > 0)
    for i in range(run.max_new):
        cur = L0 + i
        tok = _choose(run, st, rec, step, cur)
        invalid |= unfinished & (tok < 0)
        tok = tok.clamp_min(0)  # an invalid row (-1) must not reach the embedding
        if run.has_eos:
            tok = torch.where(unfinished, tok, run.pad)
        st.out[:, cur] = tok
        st.hist[:, cur] = tok if st.skip is None else tok.masked_fill(cur < st.skip, -1)
        steps_run += unfinished.any()
        if streamer is not None:
            streamer.put(tok.cpu())
        if run.eos is not None:
            unfinished &= ~torch.isin(tok, run.eos)
        if len(run.host_crit):
            # transformers' `scores` argument: the processed scores so far, or None
            unfinished &= ~run.host_crit(st.out[:, :cur + 1], tuple(rec.scores) if run.want_scores
                                         else None).to(device)
        if i == run.max_new - 1:
            break
        if sync_every_step or (i + 1) % _CHECK_EVERY == 0:
            _raise_if_invalid(invalid)
            if not bool(unfinished.any()):
                break
        _ensure_room(run, st, kv0 + cur + 1, cur + 2)
        ids = tok[:, None] if st.cache is not None else st.out[:, :cur + 1]
        step = _step(run, st, ids, kv0 + cur + 1)
        st.kv = kv0 + cur + 1
    _raise_if_invalid(invalid)
    n = int(steps_run)
    if streamer is not None:
        streamer.end()
    sequences = st.out[:, :L0 + n]
    if not run.gc.return_dict_in_generate:
        return sequences
    return _output(model, run, st, rec, sequences, n)


def _choose(run, st, rec, step, cur):
    """Record the step's outputs, run the torch-side processors, draw with sample()."""
    logits, dec_attn, cross, hidden = step
    if run.want_attn:
        rec.dec_attn.append(dec_attn)
        rec.cross.append(cross)
    if run.want_hidden:
        rec.hidden.append(hidden)
    if run.want_logits:
        rec.logits.append(logits.clone())
    scores = logits
    if len(run.torch_procs):
        scores = run.torch_procs(st.out[:, :cur], scores)
    if run.want_scores:
        rec.scores.append(processed_logits_reference(
            run.edits.apply(scores, cur), input_ids=st.hist, prompt_lens=run.L0, **run.ref_kw))
    kw = dict(run.sample_kw, **run.edits.kwargs(cur, scores))
    if run.seeded:
        # A row's draw depends only on (its seed, its decoder position): batch-independent.
        kw["offset"] = cur
    return sample(scores, input_ids=st.hist, prompt_lens=run.L0, check=False, **kw)


def _output(model, run, st, rec, sequences, n):
    """transformers' GenerateEncoderDecoderOutput for the `n` steps that ran."""
    enc = run.encoder_outputs
    # Our stand-in becomes the DynamicCache transformers returns, over the positions fed.
    cache = _as_dynamic(model, st.cache, run.B, run.L0 + n - 1) if st.own else st.cache
    return compat.make_output(
        GenerateEncoderDecoderOutput, cache, sequences=sequences,
        scores=tuple(rec.scores[:n]) if run.want_scores else None,
        logits=tuple(rec.logits[:n]) if run.want_logits else None,
        encoder_attentions=enc.get("attentions") if run.gc.output_attentions else None,
        encoder_hidden_states=enc.get("hidden_states") if run.gc.output_hidden_states else None,
        decoder_attentions=tuple(rec.dec_attn[:n]) if run.want_attn else None,
        cross_attentions=tuple(rec.cross[:n]) if run.want_attn else None,
        decoder_hidden_states=tuple(rec.hidden[:n]) if run.want_hidden else None)


def _as_dynamic(model, cache, B, length):
    """An EncoderDecoderCache of DynamicCaches holding `cache`'s first `length` positions."""
    dynamic = cache.self_attention_cache.to_dynamic(decoder_config(model), B, length)
    return EncoderDecoderCache(dynamic, cache.cross_attention_cache)


def _beam_search(model, run, extras):
    """num_beams > 1: gpu_sampler.hf.beam_search's loop, its forward on the decoder."""

    def start(rows, cache_len, want_attn):
        cache = None  # use_cache=False: transformers feeds the whole decoder sequence
        if run.cache is not None:
            cache = run.cache
        elif run.gc.use_cache is not False:
            mine = None if _dynamic_only(run, want_attn) else _own_cache(model, rows, cache_len)
            cfg = decoder_config(model)
            cache = EncoderDecoderCache(mine or DynamicCache(config=cfg), DynamicCache(config=cfg))
        fixed = _fixed_inputs(model, run, _State(cache=cache))

        # (beam_search's forward; its _Feed feeds the decoder tokens past a passed cache and
        # slices the mask to the written positions of a cache that is not static)
        def forward(ids, mask, pos, embeds=None, extra=None):
            kw = dict(fixed, decoder_input_ids=ids)
            if run.dec_mask is not None:
                kw["decoder_attention_mask"] = mask
            if run.mask_positions:
                # The loop's positions count the mask's attended tokens (transformers'
                # _prepare_position_ids_for_generation): Whisper's decoder_positions rule.
                kw["decoder_position_ids"] = (pos if cache is not None
                                              else decoder_positions(mask, ids.shape[1]))
            return model(**kw)
        return cache, forward

    def output(cache, **fields):
        enc = run.encoder_outputs
        if cache is not None and isinstance(cache.self_attention_cache, StaticKVCache):
            cache = _as_dynamic(model, cache, run.B, cache.get_seq_length())
        return compat.make_output(
            GenerateBeamEncoderDecoderOutput, cache, **fields,
            encoder_attentions=enc.get("attentions") if run.gc.output_attentions else None,
            encoder_hidden_states=enc.get("hidden_states") if run.gc.output_hidden_states
            else None)

    # The loop's mask indexes kv positions: it spans a passed cache the decoder tokens are fed
    # on top of (run.kv0), and its left padding is transformers' prompt_ignore_length.
    mask = run.dec_mask if run.dec_mask is not None else run.input_ids.new_ones(
        run.B, run.kv0 + run.L0)
    return beam_search(model, run.input_ids, mask, run.gc, run.procs, run.user_lp, run.user_sc,
                       extras.tokenizer, seed=extras.seed,
                       decoder=Decoder(start=start, output=output))


def _raise_if_invalid(invalid):
    if bool(invalid.any()):
        rows = invalid.nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} have no valid token to sample (NaN logits, or every token "
                         f"filtered to -inf by the processors)")
