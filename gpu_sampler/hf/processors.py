"""transformers' logits processors, split between torch and the fused ``sample()`` call.

The one copy of these rules: the decoder-only plan (:mod:`gpu_sampler.hf.plan`) and the
encoder-decoder loop (:mod:`gpu_sampler.hf.seq2seq`) both import them.
"""
from transformers.generation import logits_process as lp

from .common import MASKS, Unsupported, is_in

__all__ = ["WARPERS", "UNSUPPORTED_CONFIG", "plan_processors", "refuse_config", "finite_number"]

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


def plan_processors(procs, user, do_sample):
    """Split transformers' processor list into (torch-side list, fused sample() kwargs).

    The fast path fuses the repetition penalty and the trailing warpers; user processors force
    the penalty into torch so it still runs before them, as in transformers. Raises
    Unsupported for a processor neither side implements.
    """
    _refuse_processors(procs, user)
    fused = {}
    cut = len(procs)
    rank = len(WARPERS)
    while cut > 0 and do_sample:
        p = procs[cut - 1]
        r = next((i for i, (c, _) in enumerate(WARPERS) if type(p) is c), None)
        if r is None or r >= rank or is_in(p, user) or getattr(p, "min_tokens_to_keep", 1) != 1:
            break
        fused[WARPERS[r][1]] = getattr(p, WARPERS[r][1])
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
