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

from . import rng
from .cache import StaticKVCache

__all__ = ["beam_topk", "beam_topk_reference", "beam_search"]

_MASKS = (lp.NoRepeatNGramLogitsProcessor, lp.NoBadWordsLogitsProcessor,
          lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor)


# ---- the beam step --------------------------------------------------------------------------

def _topk_ids(keys, k):
    """Ids of the k largest keys per row, ordered key desc then id asc (deterministic where
    torch.topk's order among equal values is not)."""
    V = keys.shape[1]
    vals, idx = torch.topk(keys, min(k + 1, V), dim=-1)
    if k < V:
        # A tie group straddling the k-th place: which members are in is decided by the
        # lowest ids, so those (rare) rows take a stable sort of the whole row.
        straddle = (vals[:, k] == vals[:, k - 1]).nonzero().flatten()
        if straddle.numel():
            idx = idx.clone()
            idx[straddle, :k] = torch.sort(keys[straddle], dim=-1, descending=True,
                                           stable=True).indices[:, :k]
    return _order(keys.gather(1, idx[:, :k]), idx[:, :k])


def _order(keys, ids):
    """(keys, ids) of a small candidate set sorted by key desc, then id asc."""
    ids, pos = ids.sort(dim=-1)
    keys = keys.gather(1, pos)
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    return keys.gather(1, order), ids.gather(1, order)


def beam_topk_reference(logits, k, *, candidates=None, normalize=True, repetition_penalty=1.0,
                        temperature=1.0, input_ids=None, seed=None, offset=0):
    """Torch twin of ``kernels.beam.beam_topk`` (same arguments, same results).

    On CPU a fused ``log_softmax`` over the row is the fastest normaliser, so the twin forms the
    processed log-probs (transformers' own values, bit for bit) and then keeps k per row.
    """
    x = logits.float()
    N, V = x.shape
    v = F.log_softmax(x, dim=-1) if normalize else x
    if candidates is not None:
        v = v.masked_fill(candidates == float("-inf"), float("-inf"))
    if normalize:
        if input_ids is not None and input_ids.shape[1] > 0 and repetition_penalty != 1.0:
            # Padding (< 0) points at the row's largest id, so every write to an id carries
            # the same value; a row without history rewrites v[:, 0] unchanged.
            top = input_ids.max(dim=1, keepdim=True).values
            ids = torch.where(input_ids < 0, top, input_ids).clamp_min(0)
            g = v.gather(1, ids)
            v.scatter_(1, ids, torch.where(top >= 0, repetition_penalty * g, g))  # lp <= 0
        if temperature != 1.0:
            v = v / temperature
    keys = v
    if seed is not None:
        keys = v + rng.gumbel_rows(seed, offset, torch.arange(V, device=v.device).expand(N, V))
    keys, ids = _topk_ids(keys, k)
    return (keys if seed is None else v.gather(1, ids)), keys, ids


def beam_topk(logits, k, *, candidates=None, normalize=True, repetition_penalty=1.0,
              temperature=1.0, input_ids=None, seed=None, offset=0, backend="auto"):
    """Per row of ``logits``: the ``k`` best beam candidates of the processed log-probs.

    Parameters
    ----------
    logits : float tensor [N, V] (float32/float16/bfloat16), one row per beam.
    k : int, 1 <= k <= V.
    candidates : optional float tensor [N, V]: tokens where it is -inf are excluded (value
        -inf), e.g. ``logits`` after transformers' mask processors; only its -inf pattern is
        read, values and the normaliser come from ``logits``.
    normalize : bool. True: values are ``log_softmax(logits)`` (then penalty, temperature);
        False: ``logits`` are already processed log-probs, taken as they are.
    repetition_penalty : float > 0, applied to the log-probs of tokens in ``input_ids``
        (int [N, L], negative ids ignored) as transformers does (lp * penalty; lp <= 0).
    temperature : float > 0, divides the log-probs.
    seed : optional int64 tensor [N]; with it keys get Gumbel(seed, offset, id) noise, which
        makes the top-k keys a draw of k tokens without replacement (beam sampling).
    backend : "auto" (Triton on CUDA, else torch), "torch" or "triton".

    Returns
    -------
    (values float32 [N, k], keys float32 [N, k], ids int64 [N, k]) sorted by key desc, id asc.

    Example
    -------
    >>> import torch
    >>> from gpu_sampler.beam import beam_topk
    >>> v, key, ids = beam_topk(torch.tensor([[0.0, 2.0, 1.0]]), 2)
    >>> ids.tolist()
    [[1, 2]]
    """
    from .sampler import _pick_backend

    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in (
            torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be a float32/float16/bfloat16 [N, V] tensor, got "
                         f"{getattr(logits, 'shape', type(logits))}")
    N, V = logits.shape
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise ValueError(f"k must be an int in [1, V={V}], got {k!r}")
    if candidates is not None and candidates.shape != logits.shape:
        raise ValueError(f"candidates must have the shape of logits {tuple(logits.shape)}, got "
                         f"{tuple(candidates.shape)}")
    for name, v in (("repetition_penalty", repetition_penalty), ("temperature", temperature)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    if not normalize and (repetition_penalty != 1.0 or temperature != 1.0):
        raise ValueError("repetition_penalty / temperature apply to log-probs: use normalize=True")
    kw = dict(candidates=candidates, normalize=normalize,
              repetition_penalty=float(torch.tensor(repetition_penalty, dtype=torch.float32)),
              temperature=float(torch.tensor(temperature, dtype=torch.float32)),
              input_ids=input_ids, seed=seed, offset=offset)
    if _pick_backend(backend, logits) == "triton":
        from . import kernels
        return kernels.beam_topk(logits, k, **kw)
    return beam_topk_reference(logits, k, **kw)


# ---- the loop -------------------------------------------------------------------------------

def _is_in(obj, items):
    return any(obj is x for x in items)


def _plan(procs, user, do_sample):
    """(fused step kwargs, torch mask processors) or (None, None) when the chain must run in
    torch on the log-probs (anything beyond penalty + masks + temperature)."""
    fused, masks = {}, []
    for p in procs:
        if _is_in(p, user):
            return None, None
        if type(p) is lp.RepetitionPenaltyLogitsProcessor:
            fused["repetition_penalty"] = float(p.penalty)
        elif isinstance(p, _MASKS):
            masks.append(p)
        elif do_sample and type(p) is lp.TemperatureLogitsWarper:
            fused["temperature"] = float(p.temperature)
        else:
            return None, None
    return fused, lp.LogitsProcessorList(masks)


def _forward_fn(model, cache):
    params = inspect.signature(model.forward).parameters
    fwd = {"past_key_values": cache, "use_cache": True}
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
    first = (attention_mask != 0).int().argmax(dim=1)
    ignore = torch.arange(max_length, device=device)[None, :] < first[:, None]
    seeds = None
    if do_sample:
        seeds = (torch.randint(0, 2 ** 63 - 1, (N,), dtype=torch.int64, device=device)
                 if seed is None else torch.as_tensor(seed, dtype=torch.int64, device=device)
                 + torch.arange(N, dtype=torch.int64, device=device))

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
    return GenerateBeamDecoderOnlyOutput(
        sequences=sequences, sequences_scores=beam_scores if gc.output_scores else None,
        scores=all_scores, logits=raw_logits, beam_indices=beam_indices, past_key_values=cache)
