"""Drop-in replacement for ``model.generate`` (greedy and sampling) built on ``sample()``.

Configuration and inputs are resolved exactly as transformers 5.x does it (see
:mod:`gpu_sampler.hf.plan`), then one prefill and a decode loop. The loop runs on an internal
:class:`~gpu_sampler.hf.cache.StaticKVCache` that stands in for transformers' default
``DynamicCache`` (and is converted to one when returned), or on the cache transformers would use
(a passed ``past_key_values``, ``cache_implementation="static"``, ...); see
:mod:`gpu_sampler.hf.buffers`. Penalties, temperature, top-k, top-p, min-p and the draw happen in
one ``sample()`` call per step; transformers' other processors and user processors run in torch
first, in transformers' order.

One layer, one job: ``generate`` -> :func:`~gpu_sampler.hf.plan.resolve_config` (config
priority) -> :func:`~gpu_sampler.hf.plan.prepare_inputs` (an ``Inputs``) ->
:func:`~gpu_sampler.hf.plan.plan_step` (a ``Plan``: processors, criteria, sample() arguments)
-> :meth:`Buffers.allocate` (working cache and buffers) -> ``_decode`` (prefill, loop, outputs).
"""
import dataclasses
from typing import Any, NamedTuple

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..reference import processed_logits_reference
from ..sampler import sample
from . import assisted, compat, seq2seq
from .buffers import Buffers
from .common import Unsupported, raise_if_invalid, unwrap_compiled
from .step_inputs import split_inputs
from .plan import (plan_step, pop_extras, prepare_inputs, processors, refuse_arguments,
                   refuse_beam_options, resolve_config)

__all__ = ["generate", "EXTRA_ARGS"]

# generate() arguments transformers' generate does not have (a call using one cannot be handed
# to transformers without changing its meaning).
EXTRA_ARGS = ("presence_penalty", "frequency_penalty", "seed", "compile", "amateur_model",
              "cd_alpha", "cd_beta")

# How often (in decode steps) the loop reads `unfinished.any()` back to the host. Between
# checks no step synchronises; steps run after every row finished are trimmed from the output.
_CHECK_EVERY = 8


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
    assistant_model : causal LM with the model's vocabulary, optional
        Assisted generation (as ``prompt_lookup_num_tokens=`` in the kwargs), greedy or
        sampling, at any batch size: see :mod:`gpu_sampler.hf.assisted`.
    prefix_allowed_tokens_fn, negative_prompt_ids, negative_prompt_attention_mask,
    custom_generate, synced_gpus=True
        Refused with NotImplementedError naming the argument.
    **kwargs
        Model inputs: ``attention_mask`` [B, L], ``cache`` (a transformers ``Cache``:
        ``DynamicCache``, ``StaticCache`` or :class:`StaticKVCache`; continues from it; named
        ``past_key_values`` before transformers 5.24, a deprecated alias from 5.24 on that
        gives transformers' FutureWarning),
        ``inputs_embeds`` [B, L, H], ``position_ids``, ``token_type_ids``, ``logits_to_keep``;
        the image inputs of vision-language models (``pixel_values``, ``image_grid_thw``,
        ``pixel_attention_mask``, ...: LLaVA, Qwen2-VL / 2.5-VL, Gemma 3, PaliGemma,
        Idefics3, SmolVLM), forwarded as transformers does (see ``hf/step_inputs.py``).
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
    returns them) and ``cache`` (``past_key_values`` before transformers 5.24: a
    ``DynamicCache`` by default, the ``StaticCache`` for ``cache_implementation="static"``, the
    passed cache when one was given).

    Raises ``Unsupported`` (a NotImplementedError; ``.feature`` names it) for any argument or
    model it does not support (an assistant with another tokenizer, Whisper, ...), before any
    side effect, and ValueError for invalid arguments, like transformers.

    Sampling follows transformers' distribution but for one rule: a group of exactly tied
    tokens at the top-p cut is kept or dropped whole (transformers keeps the members its
    unstable sort puts above the cut). Ties need half-precision logits in practice: on a bf16
    model with peaky rows 1.6-2.7% of the steps at top-p 0.5 / 0.9 drew from another
    distribution (README, Semantics).

    Example
    -------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from gpu_sampler import generate
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                          num_attention_heads=4, intermediate_size=64,
    ...                          eos_token_id=None)).eval()  # no early stop: a fixed shape
    >>> ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    >>> out = generate(model, ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
    ...                do_sample=True, temperature=0.7, seed=0)
    >>> out.shape
    torch.Size([2, 7])
    """
    model = unwrap_compiled(model)  # torch.compile(model): its module's generate, as in HF
    if seq2seq.supports(model):  # encoder-decoder models: their own loop (hf/seq2seq.py)
        return seq2seq.generate(
            model, inputs, generation_config, logits_processor, stopping_criteria,
            prefix_allowed_tokens_fn, synced_gpus, assistant_model, streamer, negative_prompt_ids,
            negative_prompt_attention_mask, custom_generate, **kwargs)
    refuse_arguments(prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
                     negative_prompt_ids=negative_prompt_ids,
                     negative_prompt_attention_mask=negative_prompt_attention_mask,
                     custom_generate=custom_generate, synced_gpus=synced_gpus)
    extras = pop_extras(model, kwargs)
    resolved = resolve_config(model, generation_config, kwargs)
    # Decoding strategies other than greedy / sampling (beam search, assisted generation)
    # branch off on the resolved config.
    beams = (resolved.gc.num_beams or 1) > 1
    assist = assisted.wanted(assistant_model, resolved.gc)
    if assist and beams:  # transformers ignores the assistant then: let it
        raise Unsupported("assisted decoding with num_beams > 1")
    if beams and streamer is not None and not resolved.gc.do_sample:
        raise ValueError("`streamer` cannot be used with beam search (yet!). Make sure that "
                         "`num_beams` is set to 1.")
    prepared = prepare_inputs(model, resolved, inputs)
    if beams:
        refuse_beam_options(prepared, extras)
    plan = None if beams else plan_step(model, prepared, logits_processor, stopping_criteria,
                                        extras)
    run = assisted.prepare(model, plan, assistant_model, streamer) if assist else None
    # Fed only now: every refusal (Unsupported) comes before the first side effect.
    if streamer is not None:
        streamer.put(prepared.input_ids.cpu())
    if beams:
        return _beam_search(model, prepared, logits_processor, stopping_criteria, extras)
    if assist:
        return assisted.run(model, run, streamer)
    return _decode(model, plan, Buffers.allocate(model, plan), streamer)


def _beam_search(model, inputs, logits_processor, stopping_criteria, extras):
    """num_beams > 1: gpu_sampler.hf.beam_search's loop on the prepared (beam-expanded)
    inputs."""
    from .beam_search import beam_search
    procs, user_lp = processors(model, inputs, logits_processor)
    mk = inputs.model_kwargs
    return beam_search(model, inputs.input_ids, inputs.mask, inputs.gc, procs, user_lp,
                       stopping_criteria, extras.tokenizer, seed=extras.seed,
                       position_ids=mk["position_ids"], inputs_embeds=inputs.embeds,
                       step=split_inputs(model, mk), cache=inputs.cache)


# ---- the decode loop ------------------------------------------------------------------------

class Forward(NamedTuple):
    """One forward's results, as the loop consumes them at the next step."""
    logits: torch.Tensor        # [B, V] float32 (contrastive scores unless sample() fuses them)
    attentions: Any
    hidden_states: Any
    sample_kw: dict             # the amateur's arguments for sample() when fused, else {}


@dataclasses.dataclass(eq=False)
class _Outputs:
    """The per-step tensors return_dict_in_generate reports."""
    scores: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)
    attentions: list = dataclasses.field(default_factory=list)
    hidden_states: list = dataclasses.field(default_factory=list)

    def add_forward(self, plan, fwd):
        if plan.want_attn:
            self.attentions.append(fwd.attentions)
        if plan.want_hidden:
            self.hidden_states.append(fwd.hidden_states)
        if plan.want_logits:
            # A copy: the torch-side processors may change the scores in place.
            self.logits.append(fwd.logits.clone())

    def fields(self, plan, n):
        """The output's per-step fields for the `n` steps that count."""
        return dict(scores=tuple(self.scores[:n]) if plan.want_scores else None,
                    logits=tuple(self.logits[:n]) if plan.want_logits else None,
                    attentions=tuple(self.attentions[:n]) if plan.want_attn else None,
                    hidden_states=tuple(self.hidden_states[:n]) if plan.want_hidden else None)


@dataclasses.dataclass(eq=False)
class _Stop:
    """Which rows still generate, which drew no valid token, how many steps count; on device,
    read back only at checks."""
    unfinished: torch.Tensor    # bool [B]
    invalid: torch.Tensor       # bool [B]
    steps_run: torch.Tensor     # long scalar: steps with a row still unfinished

    @classmethod
    def start(cls, B, device):
        return cls(torch.ones(B, dtype=torch.bool, device=device),
                   torch.zeros(B, dtype=torch.bool, device=device),
                   torch.zeros((), dtype=torch.long, device=device))

    def admit(self, plan, tok):
        """The drawn tokens as appended: finished rows get the pad token."""
        self.invalid |= self.unfinished & (tok < 0)
        # An invalid row (-1) must not reach the embedding before the next check raises.
        tok = tok.clamp_min(0)
        if plan.has_eos:
            tok = torch.where(self.unfinished, tok, plan.pad)
        self.steps_run += self.unfinished.any()
        return tok

    def update(self, plan, tok, sequences, scores):
        """`scores`: what transformers hands its stopping criteria, the processed scores so far
        (a tuple, under return_dict_in_generate + output_scores) or None."""
        if plan.eos is not None:
            self.unfinished &= ~torch.isin(tok, plan.eos)
        if len(plan.host_crit):
            self.unfinished &= ~plan.host_crit(sequences, scores).to(self.unfinished.device)

    def all_done(self):
        """True when no row is left; raises for invalid rows first (synchronises)."""
        raise_if_invalid(self.invalid)
        return not bool(self.unfinished.any())


def _decode(model, plan, bufs, streamer):
    """Prefill, then one sample() per step until every row stops or max_length is reached."""
    inp = plan.inputs
    step = _make_step(model, plan, bufs)
    fwd = _prefill(model, plan, bufs)
    outputs, stop = _Outputs(), _Stop.start(inp.B, inp.device)
    # A cache handed back as is must not hold positions of steps past the stop.
    returns_cache = not bufs.own and bufs.cache is not None and (
        inp.cache is not None or plan.gc.return_dict_in_generate)
    # torch-side processors (user ones included) must not see steps transformers never runs:
    # with any, stop at the first step after which every row has finished.
    sync_every_step = (streamer is not None or len(plan.host_crit) > 0 or returns_cache
                       or len(plan.torch_procs) > 0)

    for i in range(inp.max_new):
        cur = inp.L0 + i
        scores = _process(plan, bufs, outputs, fwd, cur)
        tok = stop.admit(plan, _draw(plan, bufs, scores, fwd.sample_kw, cur))
        bufs.append(cur, tok)
        if streamer is not None:
            streamer.put(tok.cpu())
        stop.update(plan, tok, bufs.out[:, :cur + 1],
                    tuple(outputs.scores) if plan.want_scores else None)
        if i == inp.max_new - 1:
            break
        if (sync_every_step or (i + 1) % _CHECK_EVERY == 0) and stop.all_done():
            break
        bufs.ensure_room(model, plan, bufs.kv + 1, cur + 2)
        fwd = _feed(plan, bufs, step, tok, cur)

    raise_if_invalid(stop.invalid)
    n = int(stop.steps_run)
    sequences = bufs.out[:, :inp.L0 + n]
    if streamer is not None:
        streamer.end()
    if not plan.gc.return_dict_in_generate:
        return sequences
    return compat.make_output(
        GenerateDecoderOnlyOutput, bufs.returned_cache(model, inp.B, inp.P + n - 1),
        sequences=sequences, **outputs.fields(plan, n))


def _make_step(model, plan, bufs):
    """The decode-step callable: (model inputs) -> (last logits, attentions, hidden states)."""
    call = model
    nominal = None if bufs.own else bufs.cache  # transformers would compile only a static cache
    if not plan.compile and nominal is not None and model._valid_auto_compile_criteria(
            compat.cache_entry(nominal), plan.gc):
        call = model.get_compiled_call(plan.gc.compile_config)
    want_attn, want_hidden = plan.want_attn, plan.want_hidden

    def step(kw):
        o = call(**kw)
        return (o.logits[:, -1, :], o.attentions if want_attn else None,
                o.hidden_states if want_hidden else None)

    if plan.compile:
        if plan.inputs.device.type == "cuda":
            return torch.compile(step, mode="reduce-overhead")
        return torch.compile(step, fullgraph=False)
    return step


def _result(plan, bufs, kw, logits, attn, hidden):
    """A forward's results for the loop: against the amateur's for the same inputs `kw` when
    decoding contrastively, float32, a copy the processors may change."""
    cd_kw = {}
    if plan.amateur is not None:
        logits, cd_kw = plan.amateur.scores(logits, kw, bufs.kv, bufs.mask)
    return Forward(logits.to(torch.float32, copy=True), attn, hidden, cd_kw)


def _prefill(model, plan, bufs):
    inp = plan.inputs
    if inp.embeds is not None:
        kw = bufs.model_inputs(plan, inp.new, embeds=inp.embeds[:, -inp.new:], prefill=True)
    else:
        ids = inp.input_ids[:, -inp.new:] if bufs.cache is not None else inp.input_ids
        kw = bufs.model_inputs(plan, inp.new, ids=ids, prefill=plan.first_iteration)
    o = model(**kw)
    fwd = _result(plan, bufs, kw, o.logits[:, -1, :], o.attentions if plan.want_attn else None,
                  o.hidden_states if plan.want_hidden else None)
    bufs.kv += inp.new
    bufs.mark_static(plan)
    return fwd


def _process(plan, bufs, outputs, fwd, cur):
    """The scores sample() draws from at column `cur`: the torch-side processors' output."""
    outputs.add_forward(plan, fwd)
    scores = fwd.logits
    if len(plan.torch_procs):
        scores = plan.torch_procs(bufs.out[:, :cur], scores)
    if plan.want_scores:
        outputs.scores.append(processed_logits_reference(
            plan.edits.apply(scores, cur), input_ids=bufs.hist, prompt_lens=plan.inputs.L0,
            **plan.ref_kw))
    return scores


def _draw(plan, bufs, scores, cd_kw, cur):
    """sample() at column `cur`, the single-token processors as its logit_bias."""
    # Seeded: a row's draw depends only on (its seed, its position), not on the batch.
    offset = bufs.text_next_pos() if plan.seeded else None
    return sample(scores, input_ids=bufs.hist, prompt_lens=plan.inputs.L0, check=False,
                  offset=offset, **plan.sample_kw, **cd_kw, **plan.edits.kwargs(cur, scores))


def _feed(plan, bufs, step, tok, cur):
    """One decode forward over the tokens just appended (the whole sequence without a cache)."""
    bufs.pos[..., bufs.kv] = bufs.next_pos
    if bufs.cache is None:
        kw = bufs.model_inputs(plan, 1, ids=bufs.out[:, :cur + 1])
    else:
        kw = bufs.model_inputs(plan, 1, ids=tok[:, None])
    fwd = _result(plan, bufs, kw, *step(kw))
    bufs.advance()
    return fwd
