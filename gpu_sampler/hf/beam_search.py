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
import inspect

import torch
from torch.nn import functional as F
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers.generation.utils import GenerateBeamDecoderOnlyOutput

from .. import params
from ..beam import beam_topk
from .cache import StaticKVCache
from . import compat
from .common import MASKS, is_in, prompt_history_mask

__all__ = ["beam_search"]


# ---- the loop -------------------------------------------------------------------------------

def _plan(procs, user, do_sample):
    """(fused step kwargs, torch mask processors) or (None, None) when the chain must run in
    torch on the log-probs (anything beyond penalty + masks + temperature)."""
    fused, masks = {}, []
    for p in procs:
        if is_in(p, user):
            return None, None
        if type(p) is lp.RepetitionPenaltyLogitsProcessor:
            fused["repetition_penalty"] = float(p.penalty)
        elif isinstance(p, MASKS):
            masks.append(p)
        elif do_sample and type(p) is lp.TemperatureLogitsWarper:
            fused["temperature"] = float(p.temperature)
        else:
            return None, None
    return fused, lp.LogitsProcessorList(masks)


def _forward_fn(model, cache):
    params = inspect.signature(model.forward).parameters
    fwd = {compat.cache_arg(model): cache, "use_cache": True}
    if "logits_to_keep" in params:
        fwd["logits_to_keep"] = 1
    takes_mask, takes_pos = "attention_mask" in params, "position_ids" in params

    def forward(ids, mask, pos, token_type_ids=None):
        kw = dict(fwd)
        if takes_mask:
            kw["attention_mask"] = mask
        if takes_pos:
            kw["position_ids"] = pos
        if token_type_ids is not None:
            kw["token_type_ids"] = token_type_ids
        return model(input_ids=ids, **kw).logits[:, -1, :].to(torch.float32, copy=True)
    return forward


@torch.no_grad()
def beam_search(model, input_ids, attention_mask, gc, procs, user_processors, stopping_criteria,
                tokenizer=None, seed=None, backend="auto", position_ids=None, token_type_ids=None):
    """transformers' ``_beam_search`` (beam search and beam sampling) with the fused step.

    Called by :func:`gpu_sampler.generate` after it resolved the config and built the
    processors: ``input_ids`` / ``attention_mask`` are [B * num_beams, L] (each prompt repeated
    num_beams times), ``procs`` is transformers' processor list for them; ``position_ids`` and
    ``token_type_ids`` (same shape, expanded the same way) are the prompt's, as transformers'
    generate prepared them. Returns what
    ``model.generate`` returns: LongTensor [B * num_return_sequences, L + n], or a
    ``GenerateBeamDecoderOnlyOutput`` (sequences, sequences_scores with output_scores, scores,
    logits, beam_indices, past_key_values).
    """
    if gc.low_memory:
        raise ValueError(
            "`low_memory=True` is not supported after the beam search refactor. Please check the "
            "discussion in #35802 *after the PR got merged*, and add a comment there if your "
            "questions are not yet answered.")
    nb, nrs = gc.num_beams, gc.num_return_sequences or 1
    N, L = input_ids.shape
    B = N // nb
    device = input_ids.device
    max_length = gc.max_length
    do_sample = bool(gc.do_sample)
    eos, pad = gc._eos_token_tensor, gc._pad_token_tensor
    n_eos = eos.shape[0] if eos is not None else 0
    K = max(2, 1 + n_eos) * nb
    top_num_beam_mask = torch.arange(K, device=device) < nb
    crit = model._get_stopping_criteria(gc, sc.StoppingCriteriaList(stopping_criteria or []),
                                        tokenizer)
    fused, masks = _plan(procs, list(user_processors or []), do_sample)
    want_scores = bool(gc.return_dict_in_generate and gc.output_scores)
    want_logits = bool(gc.return_dict_in_generate and gc.output_logits)

    # transformers' fill value, `pad or eos[0]` included (a pad id of 0 falls through to eos).
    fill = (pad if pad is not None and bool(pad) else eos[0]) if eos is not None else -1
    running_sequences = torch.full((B, nb, max_length), int(fill), dtype=torch.int64,
                                   device=device)
    running_sequences[:, :, :L] = input_ids.view(B, nb, L)
    sequences = running_sequences.clone()
    running_beam_scores = torch.zeros(B, nb, dtype=torch.float32, device=device)
    running_beam_scores[:, 1:] = -1e9
    beam_scores = torch.full((B, nb), -1e9, dtype=torch.float32, device=device)
    is_sent_finished = torch.zeros(B, nb, dtype=torch.bool, device=device)
    heuristic_unsat = torch.ones(B, 1, dtype=torch.bool, device=device)
    running_beam_indices = torch.full((B, nb, max_length - L), -1, dtype=torch.int32,
                                      device=device)
    beam_indices = running_beam_indices.clone()
    batch_offset = torch.arange(B, device=device).view(-1, 1) * nb

    # Repetition-penalty history: left padding is ignored like transformers'
    # prompt_ignore_length (every beam of an item shares its prompt, so this survives reorders).
    ignore = prompt_history_mask(attention_mask, max_length)
    seeds = None
    if do_sample:
        seeds = (params.draw_seeds(N, device, None, True) if seed is None
                 else params.row_seeds(seed, N, device))

    cache_len = max(max_length - 1, L)
    cache = StaticKVCache(model.config, N, cache_len)
    forward = _forward_fn(model, cache)
    full_mask = torch.ones(N, cache_len, dtype=attention_mask.dtype, device=device)
    full_mask[:, :L] = attention_mask
    pos = position_ids if position_ids is not None else (
        model._prepare_position_ids_for_generation(input_ids, {"attention_mask": attention_mask}))
    logits = forward(input_ids, attention_mask, pos, token_type_ids)
    pos = pos[:, -1:] + 1
    # transformers repeats the last token type for every generated token; the beams of an item
    # share their prompt, so the column survives every reorder.
    tt_last = token_type_ids[:, -1:] if token_type_ids is not None else None

    all_scores = () if want_scores else None
    raw_logits = () if want_logits else None
    cur_len = L
    while True:
        flat = running_sequences[:, :, :cur_len].reshape(N, cur_len)
        if want_logits:
            raw_logits += (logits.clone(),)
        if want_scores:
            all_scores += (procs(flat, F.log_softmax(logits, dim=-1)),)
        if fused is None:
            processed = procs(flat, F.log_softmax(logits, dim=-1))
            vals, keys, toks = beam_topk(processed, K, normalize=False, seed=seeds,
                                         offset=cur_len, backend=backend)
        else:
            cand = masks(flat, logits.clone()) if len(masks) else None
            hist = flat.masked_fill(ignore[:, :cur_len], -1)
            vals, keys, toks = beam_topk(logits, K, candidates=cand, input_ids=hist, seed=seeds,
                                         offset=cur_len, backend=backend, **fused)

        # Selection across a batch item's beams on the nb * K candidates.
        acc = (vals.view(B, nb, K) + running_beam_scores[:, :, None]).view(B, nb * K)
        acc_keys = acc if seeds is None else (
            keys.view(B, nb, K) + running_beam_scores[:, :, None]).view(B, nb * K)
        # Stable: equal keys keep (beam, id) order, the lowest flat index first.
        pick = torch.sort(acc_keys, dim=1, descending=True, stable=True).indices[:, :K]
        topk_log_probs = acc.gather(1, pick)
        if seeds is not None:
            # Beam sampling: the K drawn continuations are ranked by their scores, as
            # transformers (>= 5.24) orders its multinomial draws.
            topk_log_probs, order = topk_log_probs.sort(dim=1, descending=True, stable=True)
            pick = pick.gather(1, order)
        beam = pick // K
        token = toks.view(B, nb * K).gather(1, pick)

        topk_sequences = model._gather_beams(running_sequences, beam)
        topk_sequences[:, :, cur_len] = token
        topk_beam_indices = model._gather_beams(running_beam_indices, beam)
        topk_beam_indices[:, :, cur_len - L] = (beam + batch_offset).to(torch.int32)

        hits = crit(topk_sequences[:, :, :cur_len + 1].reshape(B * K, -1), all_scores)
        hits = hits.to(device).view(B, K)
        running_sequences, running_beam_scores, running_beam_indices = (
            model._get_running_beams_for_next_iteration(
                topk_log_probs=topk_log_probs, topk_running_sequences=topk_sequences,
                topk_running_beam_indices=topk_beam_indices,
                next_token_hits_stopping_criteria=hits, num_beams=nb))
        sequences, beam_scores, beam_indices, is_sent_finished = model._update_finished_beams(
            sequences=sequences, topk_running_sequences=topk_sequences, beam_scores=beam_scores,
            topk_log_probs=topk_log_probs, beam_indices=beam_indices,
            topk_running_beam_indices=topk_beam_indices,
            is_early_stop_heuristic_unsatisfied=heuristic_unsat,
            is_sent_finished=is_sent_finished, next_token_hits_stopping_criteria=hits,
            top_num_beam_mask=top_num_beam_mask, num_beams=nb, cur_len=cur_len,
            decoder_prompt_len=L, length_penalty=gc.length_penalty,
            early_stopping=gc.early_stopping)
        beam_idx = running_beam_indices[:, :, cur_len - L].reshape(N).to(torch.long)
        cur_len += 1
        heuristic_unsat = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=heuristic_unsat,
            running_beam_scores=running_beam_scores, beam_scores=beam_scores,
            is_sent_finished=is_sent_finished, cur_len=cur_len, max_length=max_length,
            decoder_prompt_len=L, early_stopping=gc.early_stopping,
            length_penalty=gc.length_penalty)
        if not bool(model._beam_search_has_unfinished_sequences(
                heuristic_unsat, is_sent_finished, hits, gc.early_stopping)):
            break
        cache.reorder_cache(beam_idx)  # in place: gather along the batch into the same buffers
        logits = forward(running_sequences[:, :, cur_len - 1].reshape(N, 1), full_mask, pos,
                         tt_last)
        pos = pos + 1

    sequences = sequences[:, :nrs].reshape(B * nrs, max_length)
    beam_scores = beam_scores[:, :nrs].reshape(B * nrs)
    beam_indices = beam_indices[:, :nrs].reshape(B * nrs, max_length - L)
    n = int((beam_indices + 1).bool().sum(dim=1).max())
    sequences, beam_indices = sequences[:, :L + n], beam_indices[:, :n]
    if not gc.return_dict_in_generate:
        return sequences
    return compat.make_output(
        GenerateBeamDecoderOnlyOutput, cache, sequences=sequences,
        sequences_scores=beam_scores if gc.output_scores else None, scores=all_scores,
        logits=raw_logits, beam_indices=beam_indices)
