"""transformers' logits processors, split between torch and the fused ``sample()`` call.

The one copy of these rules: the decoder-only plan (:mod:`gpu_sampler.hf.plan`) and the
encoder-decoder loop (:mod:`gpu_sampler.hf.seq2seq`) both import them.
"""
import dataclasses
import math
from typing import NamedTuple

import torch
from transformers.generation import logits_process as lp

from .. import params
from ..edits import apply_edits, prepare_edits
from .common import MASKS, Unsupported, is_in, is_mask

__all__ = ["WARPERS", "UNSUPPORTED_CONFIG", "Ban", "TokenEdits", "ProcessorPlan",
           "plan_processors", "refuse_config", "finite_number"]

# Warpers fused into sample(), in transformers' order.
WARPERS = ((lp.TemperatureLogitsWarper, "temperature"), (lp.TopKLogitsWarper, "top_k"),
           (lp.TopPLogitsWarper, "top_p"), (lp.MinPLogitsWarper, "min_p"))
# transformers processors generate() would build that the loops do not implement, by the
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
               lp.TopHLogitsWarper, lp.ForcedBOSTokenLogitsProcessor,
               lp.ForcedEOSTokenLogitsProcessor, lp.ExponentialDecayLengthPenalty,
               lp.LogitNormalization, lp.WatermarkLogitsProcessor,
               lp.SynthIDTextWatermarkLogitsProcessor)
# generate() arguments with a non-default value that the loops cannot honour.
UNSUPPORTED_CONFIG = (
    ("num_beam_groups", lambda v: v is not None and v > 1),
    ("diversity_penalty", lambda v: v not in (None, 0.0)),
    ("penalty_alpha", lambda v: v is not None),
    ("dola_layers", lambda v: v is not None),
    ("guidance_scale", lambda v: v is not None and v != 1),
    ("prompt_lookup_num_tokens", lambda v: v is not None),
    ("assistant_early_exit", lambda v: v is not None),
    ("use_mtp", lambda v: bool(v)),
    ("assistant_ensemble_weight", lambda v: v is not None),
    ("speculation_type", lambda v: v is not None),
    ("token_healing", lambda v: bool(v)),
    ("constraints", lambda v: v is not None),
    ("force_words_ids", lambda v: v is not None),
    ("cache_implementation", lambda v: v == "paged"),
    ("prefill_chunk_size", lambda v: v is not None),
)


def refuse_config(gc, allowed=()):
    """Raise Unsupported for a generation-config value in UNSUPPORTED_CONFIG (names in
    `allowed` excepted: the caller runs them)."""
    for name, bad in UNSUPPORTED_CONFIG:
        if name in allowed:
            continue
        value = getattr(gc, name, None)
        if bad(value):
            raise Unsupported(f"`{name}`", f"gpu_sampler.generate does not support "
                                           f"`{name}`={value!r}")


def finite_number(name, value):
    """`value` as a float; ValueError unless it is a finite int / float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _refuse_processors(procs, user):
    for p in procs:
        name = type(p).__name__
        if not is_in(p, user) and name in _UNSUPPORTED_PROCESSORS:
            arg = _UNSUPPORTED_PROCESSORS[name]
            raise Unsupported(f"`{arg}`", f"gpu_sampler.generate does not support `{arg}` "
                                          f"({name}); use model.generate for it")
        if not is_in(p, user) and not isinstance(
                p, MASKS + _TORCH_ONLY + (lp.RepetitionPenaltyLogitsProcessor,)
                + tuple(c for c, _ in WARPERS)):
            raise Unsupported(name, f"gpu_sampler.generate does not support the logits "
                                    f"processor {name} that the generation config enables")


# ---- single-token processors as sample()'s logit_bias ------------------------------------------
#
# transformers' chain before the warpers is SequenceBias -> RepetitionPenalty -> NoRepeatNGram ->
# NoBadWords -> MinLength -> MinNewTokens -> ... -> SuppressTokens -> SuppressTokensAtBegin (5.24,
# `_get_logits_processor`); sample() applies its logit_bias before its penalties. When the part
# before the fused warpers holds only these processors and the penalty (`_pure`), the
# single-token ones become logit_bias rows and the order stays transformers':
# - sequence_bias with single-token keys adds b to the float32 logit before the penalty, in both
#   (transformers adds a [V] vector that is 0 elsewhere; x + 0 = x). Mapped only when every key
#   is a single token (a multi-token entry sums with a single one on the same id first, and
#   (x + a) + b is not x + (a + b) in floats) and no value is +inf or NaN (a +inf would turn a
#   later -inf into NaN in one order and not in the other): else the processor stays in torch,
#   and the penalty with it.
# - the -inf edits (bad_words_ids of one token, suppress_tokens, begin_suppress_tokens, the eos
#   ban of min_length / min_new_tokens) commute with the penalty (-inf * p = -inf), with a
#   finite or -inf bias and with the -inf masks left in torch (no_repeat_ngram_size, longer
#   bad_words_ids), so they can move behind those and before the penalty. bad_words_ids adds
#   -inf in transformers too; the others set -inf (torch.where), which a -inf bias equals
#   unless the logit at a banned id is NaN or +inf: there the biased logit is NaN, and the row
#   is invalid (generate raises) where transformers would have dropped that token.
# They depend on the step only through the sequence length, which the host knows: no sync.
# Beam search does not use this: transformers adds the bias to log-probabilities there.
# Assisted generation applies them (``apply``) to each verified position's scores and to the
# assistant's, at that position's length (gpu_sampler/hf/drafts.py, process_rows), where
# transformers runs these processors on the target's K + 1 positions and the assistant's drafts.

@dataclasses.dataclass(frozen=True, slots=True)
class Ban:
    """-inf on `ids` while the sequence the processors see has n tokens, start <= n < stop."""
    ids: tuple
    start: int = 0
    stop: float = math.inf


@dataclasses.dataclass(frozen=True, slots=True)
class TokenEdits:
    """transformers' single-token processors as sample()'s ``logit_bias``, per decode step.

    ``bias``: (id, value) pairs added every step (sequence_bias' single tokens, bad_words_ids'
    single tokens at -inf), ids checked against the vocabulary as transformers does; ``bans``:
    the length-dependent -inf bans, ids outside the vocabulary ignored as transformers does.
    Device tensors are built once per set of active bans (a handful per call).
    """
    bias: tuple = ()
    bans: tuple = ()
    built: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def empty(self):
        """True when no processor was mapped: no step has an edit."""
        return not self.bias and not self.bans

    def kwargs(self, n, logits):
        """sample()'s ``logit_bias`` for a step whose processors would see `n` tokens per row:
        {} when nothing applies, else {"logit_bias": (ids [B, NB], values [B, NB])}."""
        if self.empty:
            return {}
        B, V = logits.shape
        key = (V, logits.device) + tuple(
            i for i, ban in enumerate(self.bans) if ban.start <= n < ban.stop)
        if key not in self.built:
            self.built[key] = self._tensors(key[2:], V, logits.device)
        pair = self.built[key]
        if pair is None:
            return {}
        return {"logit_bias": (pair[0].expand(B, -1), pair[1].expand(B, -1))}

    def apply(self, scores, n):
        """`scores` with this step's edits, as sample() applies them (for reported scores)."""
        kw = self.kwargs(n, scores)
        if not kw:
            return scores
        return apply_edits(scores, prepare_edits(scores, None, kw["logit_bias"], check=False))

    def _tensors(self, active, V, device):
        bad = [i for i, _ in self.bias if i >= V]
        if bad:  # transformers' SequenceBias / NoBadWords check, same message
            raise ValueError(f"The model vocabulary size is {V}, but the following tokens were "
                             f"being biased: {bad}")
        pairs = list(self.bias) + [(i, -math.inf) for k in active for i in self.bans[k].ids
                                   if 0 <= i < V]
        if not pairs:
            return None
        return (torch.tensor([[i for i, _ in pairs]], dtype=torch.int64, device=device),
                torch.tensor([[v for _, v in pairs]], dtype=torch.float32, device=device))


def _ids(t):
    return tuple(int(i) for i in t.reshape(-1).tolist())


def _ban(p):
    """The Ban a transformers -inf processor becomes, or None (it stays in torch)."""
    t = type(p)
    if t is lp.SuppressTokensLogitsProcessor:
        return Ban(_ids(p.suppress_tokens))
    if t is lp.SuppressTokensAtBeginLogitsProcessor:
        return Ban(_ids(p.begin_suppress_tokens), p.begin_index, p.begin_index + 1)
    if t is lp.MinLengthLogitsProcessor:
        return Ban(_ids(p.eos_token_id), 0, p.min_length)
    if t is lp.MinNewTokensLengthLogitsProcessor:
        return Ban(_ids(p.eos_token_id), 0, p.prompt_length_to_skip + p.min_new_tokens)
    return None


def _single_bias(p):
    """(id, value) pairs of a SequenceBias processor whose keys are all single tokens and whose
    values are neither +inf nor NaN; None otherwise (it stays in torch)."""
    if type(p) is not lp.SequenceBiasLogitsProcessor:
        return None
    sb = p.sequence_bias
    if any(len(k) != 1 for k in sb) or any(not v < math.inf for v in sb.values()):
        return None
    return tuple((k[0], float(v)) for k, v in sb.items())


def _bad_words(p):
    """(single-token -inf pairs, the processor for the longer sequences or None)."""
    sb = p.sequence_bias  # eos already filtered out of the single-token words by transformers
    longer = [list(k) for k in sb if len(k) > 1]
    rest = lp.NoBadWordsLogitsProcessor(longer) if longer else None
    return tuple((k[0], -math.inf) for k in sb if len(k) == 1), rest


def _pure(head, user):
    """True when everything before the fused warpers is a -inf mask, the repetition penalty
    (with a value sample() takes: transformers also runs inf, which stays in torch) or a
    mappable sequence_bias: then the penalty is fused and the single-token edits move into
    sample()."""
    return all(is_mask(p) or (not is_in(p, user) and (
        _fusable_penalty(p) or _single_bias(p) is not None)) for p in head)


def _fusable_penalty(p):
    return type(p) is lp.RepetitionPenaltyLogitsProcessor and params.accepts(
        "repetition_penalty", p.penalty)


def _as_edits(head, user):
    """(processors left in torch, TokenEdits) for a pure head without the penalty."""
    torch_side, bias, bans = [], [], []
    for p in head:
        if is_in(p, user):
            torch_side.append(p)
        elif type(p) is lp.SequenceBiasLogitsProcessor:
            bias += _single_bias(p)
        elif type(p) is lp.NoBadWordsLogitsProcessor:
            single, rest = _bad_words(p)
            bias += single
            torch_side += [rest] if rest is not None else []
        elif (ban := _ban(p)) is not None:
            bans.append(ban)
        else:
            torch_side.append(p)
    return torch_side, TokenEdits(tuple(bias), tuple(bans))


class ProcessorPlan(NamedTuple):
    """How transformers' processor list runs: in torch, fused into sample(), as logit_bias."""
    torch_procs: lp.LogitsProcessorList   # run in torch before sample(), in transformers' order
    fused: dict                           # sample()'s penalty / warper keyword arguments
    edits: TokenEdits                     # sample()'s logit_bias, per step


def _fused_warpers(procs, user, do_sample):
    """(fused warper kwargs, cut): the trailing warpers sample() runs, procs[cut:]."""
    fused = {}
    cut = len(procs)
    rank = len(WARPERS)
    while cut > 0 and do_sample:
        p = procs[cut - 1]
        r = next((i for i, (c, _) in enumerate(WARPERS) if type(p) is c), None)
        if r is None or r >= rank or is_in(p, user) or getattr(p, "min_tokens_to_keep", 1) != 1 \
                or not params.accepts(WARPERS[r][1], getattr(p, WARPERS[r][1])):
            break
        fused[WARPERS[r][1]] = getattr(p, WARPERS[r][1])
        rank, cut = r, cut - 1
    return fused, cut


def plan_processors(procs, user, do_sample):
    """Split transformers' processor list into a ProcessorPlan.

    The fast path fuses the repetition penalty and the trailing warpers, and hands the
    single-token processors to sample() as logit_bias (see the notes above TokenEdits); user
    processors force the penalty into torch so it still runs before them, as in transformers.
    Raises Unsupported for a processor neither side implements.
    """
    _refuse_processors(procs, user)
    fused, cut = _fused_warpers(procs, user, do_sample)
    head = list(procs[:cut])
    edits = TokenEdits()
    if _pure(head, user):
        for p in head:
            if type(p) is lp.RepetitionPenaltyLogitsProcessor:
                fused["repetition_penalty"] = float(p.penalty)
        head, edits = _as_edits(
            [p for p in head if type(p) is not lp.RepetitionPenaltyLogitsProcessor], user)
    if not do_sample:
        fused["temperature"] = 0.0
    return ProcessorPlan(lp.LogitsProcessorList(head), fused, edits)
