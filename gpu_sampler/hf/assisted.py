"""Assisted generation in generate(): ``assistant_model=`` and ``prompt_lookup_num_tokens=``,
greedy and sampling, any batch size.

Each step, for every row still generating: draft up to K tokens (:mod:`gpu_sampler.hf.drafts`),
feed ``[last token, drafts]`` to the target in one forward, process the K + 1 logits as plain
generate() would at those positions (torch-side processors on the sequence extended by the
drafts before each position, then the single-token ones that plain generate() hands to
``sample()`` as ``logit_bias``, at that position's length: ``drafts.process_rows``), and
verify with :func:`gpu_sampler.speculative_sample` (with the assistant's draft distributions,
or one-hot drafts for prompt lookup; temperature 0 = greedy: accept while the draft is the
argmax). A row emits its accepted drafts and one more token;
EOS, ``max_new_tokens`` and stopping criteria cut it at the first token that stops it, as plain
generate() stops, and a finished row is padded with ``pad_token_id``.

Batch size > 1 (transformers refuses it). Rows accept different counts, so each row keeps its
own length: ``n`` tokens generated, its own positions (``next_pos``) and its own draws. All rows
are verified in the same forward with the same width (the longest draft; shorter drafts are
verified as what they are, by grouping rows with the same draft count into one
``speculative_sample`` call each). The target and the assistant each run on our
:class:`~gpu_sampler.hf.cache.StaticKVCache`, whose length is shared by the rows: after the
verification row b keeps its last token and accepted drafts, i.e. the first ``count[b]`` of the
slots just fed. When every row keeps the same count the rest is cropped; otherwise the dropped
slots are masked and each row's kept slots are packed to the right in place
(:mod:`gpu_sampler.hf.slots`), like left padding, so the cache spans the longest row and never
grows by concatenation. A masked slot is invisible and every kept token keeps its position, so
each row computes what it computes alone: greedy rows are token-identical to plain greedy
generate(), sampled rows draw from the target's distribution exactly.

Randomness is per row and position, as generate(seed=...) does: the token at position t of a
row is drawn with (row seed, t) by ``speculative_sample`` (seeds drawn from torch's generator
when ``seed`` is not given); the assistant draws from an independent stream of the same seed.

Not run here (``Unsupported``: a patched model falls back to transformers): assistants with a
different tokenizer (``assistant_tokenizer``), encoder-decoder models, ``num_beams > 1``, a
passed ``past_key_values``, ``cache_implementation`` other than the default,
``use_cache=False``, ``inputs_embeds`` and image inputs, ``output_attentions`` /
``output_hidden_states``, ``compile``, ``amateur_model``, sliding-window layers whose window
the generation could exceed, a streamer or stopping criteria without EOS at batch size > 1.
"""
import dataclasses
import inspect
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .. import params as sampling_params
from ..reference import processed_logits_reference
from ..sampler import sample
from ..speculative import speculative_sample
from . import compat, slots
from .buffers import Buffers
from .common import Unsupported, raise_if_invalid
from .drafts import Assistant, PromptLookup, Rows, process_rows
from .plan import Plan
from .step_inputs import split_inputs

__all__ = ["AssistRun", "wanted", "prepare", "run"]


def wanted(assistant_model, gc):
    """Whether the call is assisted generation (as transformers decides it)."""
    return assistant_model is not None or gc.prompt_lookup_num_tokens is not None


@dataclasses.dataclass(slots=True, eq=False)
class AssistRun:
    """What :func:`prepare` resolved for :func:`run`."""
    plan: Plan
    bufs: Buffers
    drafter: Any                # PromptLookup or Assistant
    kw: dict                    # speculative_sample() / sample() parameters, row seeds included


@dataclasses.dataclass(slots=True, eq=False)
class _Progress:
    """Where the rows stand between steps (host tensors)."""
    n: torch.Tensor             # int64 [B] tokens generated
    done: torch.Tensor          # bool [B]
    first: torch.Tensor         # int64 [B] first attended prompt column
    packed: bool = False        # the target's cache was packed (slots.compact)
    steps: int = 0
    records: list = dataclasses.field(default_factory=list)  # per step, for output_scores


def _refuse(plan, streamer):
    inp, gc = plan.inputs, plan.gc
    what = [name for name, on in (
        ("a passed past_key_values", inp.cache is not None),
        ("use_cache=False", gc.use_cache is False),
        (f"cache_implementation={gc.cache_implementation!r}",
         gc.cache_implementation not in (None, "dynamic")),
        ("inputs_embeds", inp.embeds is not None),
        ("image or per-position model inputs", plan.step.multimodal or bool(plan.step.typed)),
        ("output_attentions / output_hidden_states", plan.want_attn or plan.want_hidden),
        ("compile", plan.compile), ("amateur_model", plan.amateur is not None),
        ("a streamer at batch size > 1", streamer is not None and inp.B > 1),
        ("stopping criteria without eos_token_id at batch size > 1",
         inp.B > 1 and len(plan.host_crit) > 0 and not plan.has_eos)) if on]
    if what:
        raise Unsupported(f"assisted decoding with {what[0]}")
    if (gc.num_return_sequences or 1) > 1:
        raise ValueError(f"num_return_sequences has to be 1 when doing assisted generate, but "
                         f"is {gc.num_return_sequences}.")


def _check_cache(model, bufs, bound):
    """Unsupported unless `bufs` runs on our StaticKVCache and every row may be packed."""
    name = type(model).__name__
    if not bufs.own:
        raise Unsupported(f"assisted decoding on {name} (its cache is not a StaticKVCache)")
    cfg = model.config.get_text_config(decoder=True)
    short = [layer.sliding_window for layer in bufs.cache.layers
             if layer.is_sliding and layer.sliding_window < bound]
    if short or (cfg.model_type == "gpt_neo" and "local" in cfg.attention_layers):
        raise Unsupported(f"assisted decoding on {name} (sliding-window attention over fewer "
                          f"positions than the generation may hold: {bound})")


def _check_assistant(model, assistant, inputs):
    if not hasattr(assistant, "config") or not callable(assistant):
        raise ValueError(f"assistant_model must be a transformers causal LM, got "
                         f"{type(assistant).__name__}")
    if getattr(assistant.config, "is_encoder_decoder", False):
        raise Unsupported("an encoder-decoder assistant_model")
    vocab = model.config.get_text_config().vocab_size
    if assistant.config.get_text_config().vocab_size != vocab:
        raise ValueError("The main and assistant models have different tokenizers. Please "
                         "provide `tokenizer` and `assistant_tokenizer` to `generate()`.")
    if assistant.device != inputs.device:
        raise Unsupported(f"assistant_model on {assistant.device} (the inputs are on "
                          f"{inputs.device})")


def _assistant_plan(plan, assistant):
    """The target's plan with the assistant's forward details (cache argument, inputs)."""
    names = inspect.signature(assistant.forward).parameters
    return dataclasses.replace(
        plan, cache_arg=compat.cache_arg(assistant), takes_mask="attention_mask" in names,
        takes_pos="position_ids" in names,
        logits_to_keep=1 if "logits_to_keep" in names else None,
        step=split_inputs(assistant, plan.inputs.model_kwargs), want_scores=False,
        want_logits=False)


def prepare(model, plan, assistant_model, streamer):
    """Every refusal, then the buffers (no model call, no random draw): an AssistRun."""
    _refuse(plan, streamer)
    inp = plan.inputs
    # Rows may be apart by up to max_new tokens, and a verification feeds up to max_new more.
    bound = inp.P + 2 * inp.max_new + 2
    plan = dataclasses.replace(plan, inputs=dataclasses.replace(inp, kv_total=bound))
    if plan.gc.prompt_lookup_num_tokens is not None:  # transformers picks it first
        drafter = PromptLookup.from_config(plan.gc, model.config.get_text_config().vocab_size)
    else:
        _check_assistant(model, assistant_model, inp)
        drafter = Assistant.create(assistant_model, plan, _assistant_plan(plan, assistant_model))
        _check_cache(assistant_model, drafter.bufs, bound)
    bufs = Buffers.allocate(model, plan)
    _check_cache(model, bufs, bound)
    return AssistRun(plan, bufs, drafter, dict(plan.sample_kw))


def run(model, run_, streamer):
    """Draft / verify steps (the first one feeds the prompt too) until every row stops;
    generate()'s return value."""
    plan, bufs = run_.plan, run_.bufs
    inp = plan.inputs
    if "seed" not in run_.kw:
        # Greedy draws nothing; sampling takes one seed per row from torch's generator.
        run_.kw["seed"] = (sampling_params.draw_seeds(inp.B, inp.device, None, True)
                           if plan.gc.do_sample else
                           torch.zeros(inp.B, dtype=torch.long, device=inp.device))
    # The prompt is fed with the first drafts (its last token is the first step's last token),
    # as transformers does: next_pos is the position of the next token fed after the prompt.
    bufs.next_pos = bufs.next_pos - 1
    run_.drafter.prefill(run_.kw["seed"])
    prog = _Progress(torch.zeros(inp.B, dtype=torch.long), torch.zeros(inp.B, dtype=torch.bool),
                     (inp.mask != 0).int().argmax(1).cpu())
    while not bool(prog.done.all()):
        _step(model, run_, prog, streamer)
    run_.drafter.finish()
    return _finish(model, run_, prog, streamer)


def _rows(model, run_, prog):
    """This step's Rows (buffers grown first, so the views stay valid)."""
    plan, bufs = run_.plan, run_.bufs
    inp = plan.inputs
    live = ~prog.done
    room = inp.gc.max_length - (inp.L0 + prog.n) - 1
    budget = run_.drafter.budget(inp.B)
    limits = torch.where(live, torch.minimum(budget, room).clamp_min(0), 0)
    bufs.ensure_room(model, plan, bufs.kv, inp.L0 + int(prog.n.max()) + int(limits.max()) + 1)
    eos = plan.eos
    return Rows(out=bufs.out, hist=bufs.hist, L0=inp.L0, n=prog.n, live=live, first=prog.first,
                limits=limits, offset=bufs.text_next_pos() + 1, procs=plan.torch_procs,
                edits=plan.edits, eos=eos)


def _step(model, run_, prog, streamer):
    plan, bufs = run_.plan, run_.bufs
    rows = _rows(model, run_, prog)
    drafts = run_.drafter.propose(rows)
    dev = bufs.out.device
    last = bufs.out.gather(1, (rows.L0 + rows.n - 1)[:, None].to(dev))
    skip = plan.inputs.P - 1 if prog.steps == 0 else 0
    start = bufs.kv + skip
    ids = torch.cat([plan.inputs.input_ids[:, :skip], last, drafts.tokens], 1)
    raw = slots.feed(model, plan, bufs, ids, skip)
    scores = raw.clone() if plan.want_logits else raw
    for i in range(scores.shape[1]):
        scores[:, i] = process_rows(rows, drafts.tokens, i, scores[:, i])
    emitted = _verify(run_, rows, drafts, scores)
    processed = _processed(plan, rows, drafts, scores) if plan.want_scores else None
    counts = _emit(run_, prog, rows, emitted, processed)
    prog.packed |= slots.settle(bufs, start, counts, rows.live)
    bufs.next_pos = bufs.next_pos + counts.to(dev)
    run_.drafter.settle(rows, emitted, counts)
    run_.drafter.update(drafts.lengths, counts, rows.live)
    if plan.want_scores or plan.want_logits:
        prog.records.append(_Record(rows.n.clone(), counts, processed,
                                    raw if plan.want_logits else None))
    if streamer is not None:
        streamer.put(emitted[:, :int(counts[0])])
    prog.n += counts
    prog.steps += 1


def _subset(kw, idx):
    return {k: v[idx] if isinstance(v, torch.Tensor) and v.dim() else v for k, v in kw.items()}


def _verify(run_, rows, drafts, scores):
    """Emitted tokens int64 [B, W] host (-1 padded; none for finished rows): one
    speculative_sample per group of live rows with the same draft count (sample() for rows
    without drafts)."""
    B, W, _ = scores.shape
    emitted = torch.full((B, W), -1, dtype=torch.long)
    hist = rows.history(drafts.tokens, 0)
    for k in drafts.lengths[rows.live].unique().tolist():
        sel = (rows.live & (drafts.lengths == k)).nonzero().flatten()
        idx = sel.to(scores.device)
        kw = dict(_subset(run_.kw, idx), input_ids=hist[idx], prompt_lens=rows.L0,
                  offset=rows.offset[idx], check=False)
        if k == 0:
            tokens = sample(scores[idx, 0], **kw)[:, None]
        else:
            q = None if drafts.probs is None else drafts.probs[idx, :k]
            tokens, _ = speculative_sample(scores[idx, :k + 1], drafts.tokens[idx, :k], q, **kw)
        emitted[sel, :k + 1] = tokens.cpu()
    raise_if_invalid(rows.live & (emitted[:, 0] < 0))
    return emitted


def _emit(run_, prog, rows, emitted, processed):
    """Write the live rows' emitted tokens into the sequences, cut after the first that stops
    the row (EOS, max_new_tokens, a stopping criterion); marks finished rows. `processed`: the
    step's reported scores [B, W, V] (output_scores) or None. Returns the number of tokens each
    row emitted, int64 [B] host."""
    plan, bufs = run_.plan, run_.bufs
    inp = plan.inputs
    W = emitted.shape[1]
    j = torch.arange(W)[None, :]
    counts = torch.minimum((emitted >= 0).sum(1), inp.max_new - prog.n)
    done = prog.n + counts >= inp.max_new
    if plan.eos is not None:
        eos = torch.isin(emitted, plan.eos.cpu()) & (j < counts[:, None])
        hit = eos.any(1)
        counts = torch.where(hit, eos.int().argmax(1) + 1, counts)
        done |= hit
    rr, jj = (j < counts[:, None]).nonzero(as_tuple=True)
    cols = (inp.L0 + prog.n[rr] + jj).to(bufs.out.device)
    rd, tok = rr.to(bufs.out.device), emitted[rr, jj].to(bufs.out.device)
    bufs.out[rd, cols] = tok
    bufs.hist[rd, cols] = tok
    if len(plan.host_crit):
        counts, done = _criteria(plan, bufs, prog, rows, processed, counts, done)
    prog.done |= done & rows.live
    return counts


def _criteria(plan, bufs, prog, rows, processed, counts, done):
    """The host stopping criteria after each emitted token of each live row, on the row's own
    sequence: a row stops at the first token they flag. Their `scores` argument is what
    transformers hands them: the row's reported scores so far, a tuple of [1, V] (under
    return_dict_in_generate + output_scores), else None."""
    counts, done = counts.clone(), done.clone()
    for b in rows.live.nonzero().flatten().tolist():
        end = rows.L0 + int(rows.n[b])
        before = _row_scores(prog.records, b) if processed is not None else None
        for j in range(int(counts[b])):
            so_far = None if processed is None else before + tuple(
                processed[b:b + 1, i] for i in range(j + 1))
            if bool(plan.host_crit(bufs.out[b:b + 1, :end + j + 1], so_far)[0]):
                counts[b], done[b] = j + 1, True
                break
    return counts, done


def _row_scores(records, b):
    """Row b's reported scores of the earlier steps, a tuple of [1, V]."""
    return tuple(rec.scores[b:b + 1, i] for rec in records for i in range(int(rec.counts[b])))


@dataclasses.dataclass(slots=True, eq=False)
class _Record:
    """One step's per-position tensors for output_scores / output_logits."""
    n: torch.Tensor             # int64 [B] host: tokens generated before the step
    counts: torch.Tensor        # int64 [B] host: tokens emitted by the step
    scores: Any                 # float32 [B, W, V] processed scores, or None
    logits: Any                 # float32 [B, W, V] raw logits, or None


def _processed(plan, rows, drafts, scores):
    """The step's scores as output_scores reports them, float32 [B, W, V]."""
    return torch.stack([processed_logits_reference(
        scores[:, i], input_ids=rows.history(drafts.tokens, i), prompt_lens=rows.L0,
        **plan.ref_kw) for i in range(scores.shape[1])], 1)


def _per_token(records, field, B, N):
    """The tuple of N [B, V] tensors generate() reports: row b's j-th generated token's entry
    (zeros past the end of a row that stopped earlier)."""
    out = None
    for rec in records:
        t = getattr(rec, field)
        if out is None:
            out = t.new_zeros(B, N, t.shape[-1])
        rr, ii = (torch.arange(t.shape[1])[None, :] < rec.counts[:, None]).nonzero(
            as_tuple=True)
        dev = t.device
        out[rr.to(dev), (rec.n[rr] + ii).to(dev)] = t[rr.to(dev), ii.to(dev)]
    return tuple(out[:, j] for j in range(N))


def _finish(model, run_, prog, streamer):
    plan, bufs = run_.plan, run_.bufs
    inp = plan.inputs
    N = int(prog.n.max())
    sequences = bufs.out[:, :inp.L0 + N]
    if plan.has_eos:  # rows that stopped earlier are padded, as generate() pads them
        cols = torch.arange(N, device=sequences.device)[None, :]
        pad = cols >= prog.n.to(sequences.device)[:, None]
        sequences[:, inp.L0:] = torch.where(pad, plan.pad, sequences[:, inp.L0:])
    if streamer is not None:
        streamer.end()
    if not plan.gc.return_dict_in_generate:
        return sequences
    fields = {name: (_per_token(prog.records, name, inp.B, N) if want else None)
              for name, want in (("scores", plan.want_scores), ("logits", plan.want_logits))}
    cache = slots.returned_cache(model, bufs, inp, inp.P + N - 1, prog.packed)
    return compat.make_output(GenerateDecoderOnlyOutput, cache, sequences=sequences,
                              attentions=None, hidden_states=None, **fields)
