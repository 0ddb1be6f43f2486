"""Beam search and beam sampling for :func:`gpu_sampler.generate`, on a static KV cache.

The loop keeps transformers 5.x's beam-search state (running / finished beams, scores, beam
indices, the early-stopping heuristic) and reuses its bookkeeping helpers, so the results are
transformers'. What changes is the expensive part: transformers builds the processed
log-probabilities [B * num_beams, V] and runs ``topk`` (or ``multinomial``) over
[B, num_beams * V]; here :func:`beam_topk` computes, per beam row and in one pass, the
log-softmax normaliser and the row's best ``beams_to_keep`` candidates, and the selection across
a batch item's beams runs on those ``num_beams * beams_to_keep`` numbers. The KV cache is
reordered in place after each step.

Processors that transformers applies to the log-probabilities keep their order. Fused into the
step (exact): the repetition penalty (elementwise on log-probs given the history) and the
temperature; the -inf mask processors (no_repeat_ngram, bad_words, min_length) run in torch on
the raw logits first (a -inf commutes with the log-softmax shift, the penalty and the
temperature). Anything else (user processors, top-k / top-p / min-p ... under beam sampling)
runs transformers' own chain on the log-probs in torch, then the step picks the candidates.
"""
import dataclasses
import inspect
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch.nn import functional as F
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers import DynamicCache
from transformers.generation.utils import GenerateBeamDecoderOnlyOutput

from .. import params
from ..beam import beam_topk
from .cache import StaticKVCache
from . import compat
from .common import cached_positions, is_in, is_mask, own_cache, prompt_history_mask

__all__ = ["beam_search"]


class Decoder(NamedTuple):
    """An encoder-decoder model's hooks into the beam loop (gpu_sampler.hf.seq2seq)."""
    start: Callable    # start(rows, cache_len, want_attn) -> (cache, forward)
    output: Callable   # output(cache, **fields) -> the returned output


# ---- the loop -------------------------------------------------------------------------------

def _plan(procs, user, do_sample):
    """(fused step kwargs, torch mask processors) or (None, None) when the chain must run in
    torch on the log-probs (anything beyond penalty + masks + temperature)."""
    fused, masks = {}, []
    for p in procs:
        if is_in(p, user):
            return None, None
        if type(p) is lp.RepetitionPenaltyLogitsProcessor and params.accepts(
                "repetition_penalty", p.penalty):
            fused["repetition_penalty"] = float(p.penalty)
        elif is_mask(p):
            masks.append(p)
        elif do_sample and type(p) is lp.TemperatureLogitsWarper and params.accepts(
                "temperature", p.temperature):
            fused["temperature"] = float(p.temperature)
        else:
            return None, None
    return fused, lp.LogitsProcessorList(masks)


def _forward_fn(model, cache, plan):
    """forward(ids, mask, pos, embeds, extra) -> the model's output (last position's logits,
    plus attentions / hidden states where the call returns them); a None cache:
    ``use_cache=False``."""
    params = inspect.signature(model.forward).parameters
    fwd = {"use_cache": cache is not None}
    if cache is not None:
        fwd[compat.cache_arg(model)] = cache
    if "logits_to_keep" in params:
        fwd["logits_to_keep"] = 1
    if plan.want_attn:
        fwd["output_attentions"] = True
    if plan.want_hidden:
        fwd["output_hidden_states"] = True
    takes_mask, takes_pos = "attention_mask" in params, "position_ids" in params

    def forward(ids, mask, pos, embeds=None, extra=None):
        kw = dict(fwd, **(extra or {}))
        if takes_mask and mask is not None:
            kw["attention_mask"] = mask
        if takes_pos:
            kw["position_ids"] = pos
        if embeds is not None:  # the prefill from inputs_embeds, as transformers feeds it
            return model(inputs_embeds=embeds, **kw)
        return model(input_ids=ids, **kw)
    return forward


def _last_logits(out):
    return out.logits[:, -1, :].to(torch.float32, copy=True)


class _Recorded:
    """The per-step tuples transformers returns: scores, raw logits, attentions, hidden states
    (each None unless asked for), in its order: one entry per model call, as the model gave it
    (not beam-reordered)."""

    def __init__(self, plan, enc_dec=False):
        self.enc_dec = enc_dec
        self.scores = () if plan.want_scores else None
        self.logits = () if plan.want_logits else None
        self.attentions = () if plan.want_attn else None
        self.cross_attentions = () if plan.want_attn and enc_dec else None
        self.hidden_states = () if plan.want_hidden else None

    def model_call(self, out):
        if self.attentions is not None:
            self.attentions += (out.decoder_attentions if self.enc_dec else out.attentions,)
        if self.cross_attentions is not None:
            self.cross_attentions += (out.cross_attentions,)
        if self.hidden_states is not None:
            self.hidden_states += (
                out.decoder_hidden_states if self.enc_dec else out.hidden_states,)

    def step(self, logits, processed):
        if self.logits is not None:
            self.logits += (logits.clone(),)
        if self.scores is not None:
            self.scores += (processed,)


@torch.no_grad()
def beam_search(model, input_ids, attention_mask, gc, procs, user_processors, stopping_criteria,
                tokenizer=None, seed=None, backend="auto", position_ids=None,
                inputs_embeds=None, decoder=None, step=None, cache=None):
    """transformers' ``_beam_search`` (beam search and beam sampling) with the fused step.

    Called by :func:`gpu_sampler.generate` after it resolved the config and built the
    processors: ``input_ids`` / ``attention_mask`` are [B * num_beams, L] (each prompt repeated
    num_beams times), ``procs`` is transformers' processor list for them; ``position_ids``
    (same shape, expanded the same way) are the prompt's, as transformers' generate prepared
    them. ``inputs_embeds`` [B * num_beams, P, H] (then ``attention_mask`` and
    ``position_ids`` span its P positions, ``input_ids`` may be [N, 0]) feeds the prefill
    instead of the ids, as in transformers. ``step`` (a
    :class:`~gpu_sampler.hf.step_inputs.StepInputs`) carries the other model inputs (image
    inputs at the prefill, per-position inputs such as token types, a position offset). With
    ``gc.use_cache=False`` every forward gets the whole sequence, its mask, positions and
    per-position inputs and the prefill's inputs, and no cache is returned, as in transformers.
    ``cache``: a passed cache with B * num_beams rows (transformers does not expand one) holding
    the prompt's first positions: the prefill feeds the rest, the loop reorders it in place and
    returns it.
    Returns what ``model.generate`` returns: LongTensor [B * num_return_sequences, L + n], or a
    ``GenerateBeamDecoderOnlyOutput`` (sequences, sequences_scores with output_scores, scores,
    logits, attentions, hidden_states, beam_indices, past_key_values).

    Encoder-decoder models pass ``decoder`` (from :mod:`gpu_sampler.hf.seq2seq`):
    ``decoder.start(rows, cache_len, want_attn)`` -> (cache, forward) replaces the cache and
    the forward above (``input_ids`` / ``attention_mask`` are then the decoder's; a None cache:
    ``use_cache=False``), and ``decoder.output(cache, **fields)`` builds the returned output.
    """
    if gc.low_memory:
        raise ValueError(
            "`low_memory=True` is not supported after the beam search refactor. Please check the "
            "discussion in #35802 *after the PR got merged*, and add a comment there if your "
            "questions are not yet answered.")
    plan = _BeamPlan.resolve(model, input_ids, attention_mask, gc, procs, user_processors,
                             stopping_criteria, tokenizer, seed, backend)
    beams = _Beams.start(plan, input_ids)
    P = attention_mask.shape[1]  # prompt positions the model sees (ids, or embeddings)
    cache_len = max(P + plan.max_length - plan.L - 1, P)
    if decoder is not None:
        cache, forward = decoder.start(plan.N, cache_len, plan.want_attn)
    else:
        passed = cache
        cache = passed if passed is not None else _decoder_only_cache(model, gc, plan, cache_len)
        forward = _forward_fn(model, cache, plan)
    pos = position_ids if position_ids is not None else (
        model._prepare_position_ids_for_generation(input_ids, {"attention_mask": attention_mask}))
    feed = _Feed.start(plan, step, attention_mask, pos, cache_len, cache)
    rec = _Recorded(plan, enc_dec=decoder is not None)
    out = forward(*feed.first(input_ids, attention_mask, inputs_embeds))
    while True:
        rec.model_call(out)
        logits = _last_logits(out)
        flat = beams.running_sequences[:, :, :beams.cur_len].reshape(plan.N, beams.cur_len)
        # transformers' chain on the log-probs, run once a step (user processors may keep
        # state): where the scores are recorded or the fused step cannot run it.
        processed = (plan.procs(flat, F.log_softmax(logits, dim=-1))
                     if plan.want_scores or plan.fused is None else None)
        rec.step(logits, processed)
        vals, keys, toks = _candidates(plan, flat, logits, beams.cur_len, processed)
        topk = _select(model, plan, beams, vals, keys, toks)
        if topk is None:  # exact ties decide the pick: transformers' torch.topk decides them
            topk = _select_exact(model, plan, beams, flat, logits, processed)
        beam_idx, unfinished = _update(model, plan, beams, *topk, rec.scores)
        if cache is not None:
            # In place: gather along the batch into the same buffers. After the last step too,
            # as transformers: the returned (or passed) cache holds the running beams.
            cache.reorder_cache(beam_idx)
        if not unfinished:
            break
        out = forward(*feed.next(plan, beams))
    if (gc.return_dict_in_generate and decoder is None and isinstance(cache, StaticKVCache)
            and cache is not passed):
        cache = cache.to_dynamic(model.config)  # our stand-in for transformers' DynamicCache
    return _finish(plan, beams, cache, rec, decoder)


def _decoder_only_cache(model, gc, plan, cache_len):
    """The decoder-only loop's cache: none with use_cache=False (transformers then feeds the
    whole sequence each step); a DynamicCache when attention weights or hidden states are
    returned (they must span the written positions only, as transformers' do: padding rows'
    weights, and so their hidden states, depend on the span), when a cache with sliding
    layers is returned or where ours would not give its results (common.own_cache); else our
    StaticKVCache, reordered in place and returned as a DynamicCache."""
    if gc.use_cache is False:
        return None
    if gc.cache_implementation not in (None, "dynamic"):
        # transformers' own cache for this implementation ("static", "offloaded", ...), as
        # its generate builds it for the B * num_beams rows (and returns it): same type, same
        # (sticky) length, same attention span.
        made = {}
        model._prepare_cache_for_generation(gc, made, None, plan.B, cache_len)
        return compat.pop_cache(made)
    if plan.want_attn or plan.want_hidden:  # padding rows' hidden states depend on the span too
        return DynamicCache(config=model.config)
    mine = own_cache(model, plan.N, cache_len)
    if mine is None or (gc.return_dict_in_generate and any(mine.is_sliding)):
        # A returned DynamicCache holds sliding layers' last window: run on one then.
        return DynamicCache(config=model.config)
    return mine


@dataclasses.dataclass(eq=False)
class _Feed:
    """What the forwards get besides the tokens: the mask, positions and other model inputs.

    On a cache a decode forward gets the last token, its position, the mask and the inputs
    every generated token gets (the same for every beam of an item, so they survive reorders).
    Without one (``whole``) it gets what transformers feeds then: the whole sequence, its mask,
    its positions, the per-position inputs over it and the prefill's inputs again."""
    whole: bool
    P: int                  # prompt positions (the mask's columns before any generated token)
    past: int               # prompt positions a passed cache already holds
    span: int               # mask columns a static cache attends over; 0: the written ones
    full_mask: torch.Tensor  # [N, max(cache_len, span)], 1 beyond the prompt
    pos: torch.Tensor       # [..., N, n]: positions (offset included) fed so far, or the last
    prefill: dict           # the prefill's other inputs, per-position ones excepted
    later: dict             # the decode forwards' other inputs, per-position ones excepted
    typed: dict             # name -> [N, width] per-position input by kv position
    decode_typed: tuple     # per-position names a decode forward on a cache gets
    decode_mask: bool = True  # a decode forward on a cache gets the attention mask

    @classmethod
    def start(cls, plan, step, attention_mask, pos, cache_len, cache):
        P = attention_mask.shape[1]
        whole = cache is None
        # A static cache attends over its whole length (ours, a passed StaticCache).
        span = cache.get_max_length() if cache is not None and cache.is_compileable else 0
        full_mask = attention_mask.new_ones(plan.N, max(cache_len, span))
        full_mask[:, :P] = attention_mask
        past = cached_positions(cache)
        typed = step.per_position(P, full_mask.shape[1])[0] if step is not None else {}
        if step is None:
            return cls(whole, P, past, span, full_mask, pos, {}, {}, typed, ())
        prefill = dict(step.every, **step.prefill)
        later = prefill if whole else dict(step.every)
        return cls(whole, P, past, span, full_mask, pos + step.pos_offset, prefill, later, typed,
                   () if whole else tuple(step.decode_typed), whole or step.decode_mask)

    def first(self, input_ids, attention_mask, embeds):
        """The prefill's (ids, mask, positions, embeds, extra): the positions a passed cache
        lacks."""
        new = self.P - self.past
        if embeds is not None:
            embeds = embeds[:, -new:]
        elif input_ids.shape[1] > new:
            input_ids = input_ids[:, -new:]
        self.pos = self.pos[..., -new:]
        extra = dict(self.prefill, **{k: buf[:, self.past:self.P] for k, buf in self.typed.items()})
        if self.span > self.P:
            # A static cache attends over its whole length from the prefill on: the 2-D mask
            # must be that long too (Bloom builds its ALiBi bias from it; the greedy loop's
            # prefill passes the same, Buffers.model_inputs). Unwritten slots are 1 and hidden
            # by causality.
            attention_mask = self.full_mask[:, :self.span]
        return input_ids, attention_mask, self.pos, embeds, extra

    def next(self, plan, beams):
        """(ids, mask, positions, embeds, extra) for the forward after a step; the beams have
        their new token at column cur_len - 1."""
        n = self.P - plan.L + beams.cur_len  # positions once the new token is fed
        new_pos = self.pos[..., -1:] + 1
        extra = dict(self.later)
        if self.whole:
            self.pos = torch.cat([self.pos, new_pos], dim=-1)
            ids = beams.running_sequences[:, :, :beams.cur_len].reshape(plan.N, beams.cur_len)
            extra.update({name: buf[:, :n] for name, buf in self.typed.items()})
        else:
            self.pos = new_pos
            ids = beams.running_sequences[:, :, beams.cur_len - 1].reshape(plan.N, 1)
            extra.update({name: self.typed[name][:, n - 1:n] for name in self.decode_typed})
        mask = self.full_mask[:, :max(n, self.span)] if self.decode_mask else None
        return ids, mask, self.pos, None, extra


@dataclasses.dataclass(frozen=True)
class _BeamPlan:
    """What a beam_search call resolved before its loop."""
    gc: Any
    procs: lp.LogitsProcessorList    # transformers' chain, on the log-probs
    nb: int                          # num_beams
    nrs: int                         # num_return_sequences
    N: int                           # rows: B * nb
    B: int                           # batch items
    L: int                           # prompt length
    K: int                           # candidates kept per beam row (and per item)
    max_length: int
    device: torch.device
    crit: sc.StoppingCriteriaList
    fused: Optional[dict]            # the fused step's kwargs, None: the chain runs in torch
    masks: Optional[lp.LogitsProcessorList]  # -inf masks run before the fused step
    want_scores: bool
    want_logits: bool
    want_attn: bool
    want_hidden: bool
    ignore: torch.Tensor             # bool [N, max_length]: left padding, out of the history
    seeds: Optional[torch.Tensor]    # row seeds under beam sampling
    top_num_beam_mask: torch.Tensor  # bool [K]: the first nb candidates
    batch_offset: torch.Tensor       # [B, 1] first row of each item
    backend: str

    @classmethod
    def resolve(cls, model, input_ids, attention_mask, gc, procs, user_processors,
                stopping_criteria, tokenizer, seed, backend):
        nb = gc.num_beams
        N, L = input_ids.shape
        device = input_ids.device
        do_sample = bool(gc.do_sample)
        eos = gc._eos_token_tensor
        n_eos = eos.shape[0] if eos is not None else 0
        K = max(2, 1 + n_eos) * nb
        crit = model._get_stopping_criteria(gc, sc.StoppingCriteriaList(stopping_criteria or []),
                                            tokenizer)
        fused, masks = _plan(procs, list(user_processors or []), do_sample)
        seeds = None
        if do_sample:
            seeds = (params.draw_seeds(N, device, None, True) if seed is None
                     else params.row_seeds(seed, N, device))
        return cls(
            gc=gc, procs=procs, nb=nb, nrs=gc.num_return_sequences or 1, N=N, B=N // nb, L=L,
            K=K, max_length=gc.max_length, device=device, crit=crit, fused=fused, masks=masks,
            want_scores=bool(gc.return_dict_in_generate and gc.output_scores),
            want_logits=bool(gc.return_dict_in_generate and gc.output_logits),
            want_attn=bool(gc.return_dict_in_generate and gc.output_attentions),
            want_hidden=bool(gc.return_dict_in_generate and gc.output_hidden_states),
            # Repetition-penalty history: left padding is ignored like transformers'
            # prompt_ignore_length (every beam of an item shares its prompt, so this survives
            # reorders): the first attended position of the whole mask, counted on the
            # sequences (from inputs_embeds they hold new tokens only, whose first ones
            # transformers then ignores on left-padded rows).
            ignore=prompt_history_mask(attention_mask, gc.max_length), seeds=seeds,
            top_num_beam_mask=torch.arange(K, device=device) < nb,
            batch_offset=torch.arange(N // nb, device=device).view(-1, 1) * nb, backend=backend)


@dataclasses.dataclass(eq=False)
class _Beams:
    """transformers 5.x's beam-search state: running and finished beams, their scores and
    beam indices, the early-stopping heuristic, and the current length."""
    running_sequences: torch.Tensor     # [B, nb, max_length]
    running_beam_scores: torch.Tensor   # [B, nb]
    running_beam_indices: torch.Tensor  # [B, nb, max_length - L]
    sequences: torch.Tensor             # finished: [B, nb, max_length]
    beam_scores: torch.Tensor           # [B, nb]
    beam_indices: torch.Tensor          # [B, nb, max_length - L]
    is_sent_finished: torch.Tensor      # bool [B, nb]
    heuristic_unsat: torch.Tensor       # bool [B, 1]
    cur_len: int

    @classmethod
    def start(cls, plan, input_ids):
        gc, B, nb, L, device = plan.gc, plan.B, plan.nb, plan.L, plan.device
        eos, pad = gc._eos_token_tensor, gc._pad_token_tensor
        # transformers' fill value, `pad or eos[0]` included (a pad id of 0 falls through to eos).
        fill = (pad if pad is not None and bool(pad) else eos[0]) if eos is not None else -1
        running = torch.full((B, nb, plan.max_length), int(fill), dtype=torch.int64,
                             device=device)
        running[:, :, :L] = input_ids.view(B, nb, L)
        running_scores = torch.zeros(B, nb, dtype=torch.float32, device=device)
        running_scores[:, 1:] = -1e9
        running_indices = torch.full((B, nb, plan.max_length - L), -1, dtype=torch.int32,
                                     device=device)
        return cls(running_sequences=running, running_beam_scores=running_scores,
                   running_beam_indices=running_indices, sequences=running.clone(),
                   beam_scores=torch.full((B, nb), -1e9, dtype=torch.float32, device=device),
                   beam_indices=running_indices.clone(),
                   is_sent_finished=torch.zeros(B, nb, dtype=torch.bool, device=device),
                   heuristic_unsat=torch.ones(B, 1, dtype=torch.bool, device=device),
                   cur_len=L)


def _candidates(plan, flat, logits, cur_len, processed):
    """(values, sort keys, tokens) [N, k]: each beam row's best continuations, k = min(K, V)
    (a row holds V; transformers picks K among an item's nb * V), K + 1 under beam search
    (so that _select sees a tie at the K-th place). ``processed``: the chain's log-probs
    [N, V], given where the chain runs in torch (plan.fused None)."""
    k = min(plan.K + (plan.seeds is None), logits.shape[-1])
    if plan.fused is None:
        return beam_topk(processed, k, normalize=False, seed=plan.seeds, offset=cur_len,
                         backend=plan.backend)
    cand = plan.masks(flat, logits.clone()) if len(plan.masks) else None
    hist = flat.masked_fill(plan.ignore[:, :cur_len], -1) if cur_len else None
    return beam_topk(logits, k, candidates=cand, input_ids=hist, seed=plan.seeds,
                     offset=cur_len, backend=plan.backend, **plan.fused)


def _select(model, plan, beams, vals, keys, toks):
    """(top-K log-probs, sequences, beam indices) per item, chosen across its beams on the
    nb * k candidates (k per beam row); None under beam search when equal scores among an
    item's best K + 1 make the pick depend on torch.topk's tie order."""
    B, nb, K, k = plan.B, plan.nb, plan.K, vals.shape[1]
    running = beams.running_beam_scores[:, :, None]
    acc = (vals.view(B, nb, k) + running).view(B, nb * k)
    acc_keys = acc if plan.seeds is None else (keys.view(B, nb, k) + running).view(B, nb * k)
    ranked = torch.sort(acc_keys, dim=1, descending=True, stable=True)
    if plan.seeds is None:
        top = ranked.values[:, :K + 1]
        if bool((top[:, 1:] == top[:, :-1]).any()):
            return None
    pick = ranked.indices[:, :K]
    topk_log_probs = acc.gather(1, pick)
    if plan.seeds is not None and compat.beam_sampling_ranks_draws():
        # Beam sampling: the K drawn continuations are ranked by their scores, as
        # transformers (>= 5.24) orders its multinomial draws.
        topk_log_probs, order = topk_log_probs.sort(dim=1, descending=True, stable=True)
        pick = pick.gather(1, order)
    return _gather(model, plan, beams, topk_log_probs, pick // k,
                   toks.view(B, nb * k).gather(1, pick))


def _select_exact(model, plan, beams, flat, logits, processed=None):
    """_select as transformers computes it: torch.topk over each item's nb * V accumulated
    log-probs (transformers' processor chain on its log_softmax), whose tie order is
    torch's."""
    if processed is None:
        processed = plan.procs(flat, F.log_softmax(logits, dim=-1))
    V = processed.shape[-1]
    acc = processed.view(plan.B, plan.nb, V) + beams.running_beam_scores[:, :, None]
    topk_log_probs, pick = torch.topk(acc.view(plan.B, plan.nb * V), k=plan.K)
    return _gather(model, plan, beams, topk_log_probs, pick // V, pick % V)


def _gather(model, plan, beams, topk_log_probs, beam, token):
    """(top-K log-probs, sequences, beam indices) for the picked (beam, token) [B, K]."""
    cur_len = beams.cur_len
    topk_sequences = model._gather_beams(beams.running_sequences, beam)
    topk_sequences[:, :, cur_len] = token
    topk_beam_indices = model._gather_beams(beams.running_beam_indices, beam)
    topk_beam_indices[:, :, cur_len - plan.L] = (beam + plan.batch_offset).to(torch.int32)
    return topk_log_probs, topk_sequences, topk_beam_indices


def _update(model, plan, beams, topk_log_probs, topk_sequences, topk_beam_indices, all_scores):
    """transformers' bookkeeping for one step, on `beams` in place. Returns (the rows the cache
    is reordered by, whether any item is unfinished)."""
    gc, L, nb, cur_len = plan.gc, plan.L, plan.nb, beams.cur_len
    hits = plan.crit(topk_sequences[:, :, :cur_len + 1].reshape(plan.B * plan.K, -1), all_scores)
    hits = hits.to(plan.device).view(plan.B, plan.K)
    beams.running_sequences, beams.running_beam_scores, beams.running_beam_indices = (
        model._get_running_beams_for_next_iteration(
            topk_log_probs=topk_log_probs, topk_running_sequences=topk_sequences,
            topk_running_beam_indices=topk_beam_indices,
            next_token_hits_stopping_criteria=hits, num_beams=nb))
    beams.sequences, beams.beam_scores, beams.beam_indices, beams.is_sent_finished = (
        model._update_finished_beams(
            sequences=beams.sequences, topk_running_sequences=topk_sequences,
            beam_scores=beams.beam_scores, topk_log_probs=topk_log_probs,
            beam_indices=beams.beam_indices, topk_running_beam_indices=topk_beam_indices,
            is_early_stop_heuristic_unsatisfied=beams.heuristic_unsat,
            is_sent_finished=beams.is_sent_finished, next_token_hits_stopping_criteria=hits,
            top_num_beam_mask=plan.top_num_beam_mask, num_beams=nb, cur_len=cur_len,
            decoder_prompt_len=L, length_penalty=gc.length_penalty,
            early_stopping=gc.early_stopping))
    beam_idx = beams.running_beam_indices[:, :, cur_len - L].reshape(plan.N).to(torch.long)
    beams.cur_len += 1
    beams.heuristic_unsat = model._check_early_stop_heuristic(
        is_early_stop_heuristic_unsatisfied=beams.heuristic_unsat,
        running_beam_scores=beams.running_beam_scores, beam_scores=beams.beam_scores,
        is_sent_finished=beams.is_sent_finished, cur_len=beams.cur_len,
        max_length=plan.max_length, decoder_prompt_len=L, early_stopping=gc.early_stopping,
        length_penalty=gc.length_penalty)
    return beam_idx, bool(model._beam_search_has_unfinished_sequences(
        beams.heuristic_unsat, beams.is_sent_finished, hits, gc.early_stopping))


def _finish(plan, beams, cache, rec, decoder=None):
    """What model.generate returns: the best num_return_sequences per item."""
    B, nrs, L, gc = plan.B, plan.nrs, plan.L, plan.gc
    sequences = beams.sequences[:, :nrs].reshape(B * nrs, plan.max_length)
    beam_scores = beams.beam_scores[:, :nrs].reshape(B * nrs)
    beam_indices = beams.beam_indices[:, :nrs].reshape(B * nrs, plan.max_length - L)
    n = int((beam_indices + 1).bool().sum(dim=1).max())
    sequences, beam_indices = sequences[:, :L + n], beam_indices[:, :n]
    if not gc.return_dict_in_generate:
        return sequences
    if decoder is not None:
        return decoder.output(
            cache, sequences=sequences, sequences_scores=beam_scores if gc.output_scores else None,
            scores=rec.scores, logits=rec.logits, beam_indices=beam_indices,
            decoder_attentions=rec.attentions, cross_attentions=rec.cross_attentions,
            decoder_hidden_states=rec.hidden_states)
    return compat.make_output(
        GenerateBeamDecoderOnlyOutput, cache, sequences=sequences,
        sequences_scores=beam_scores if gc.output_scores else None, scores=rec.scores,
        logits=rec.logits, beam_indices=beam_indices, attentions=rec.attentions,
        hidden_states=rec.hidden_states)
