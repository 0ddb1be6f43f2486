"""Draft tokens for assisted decoding: prompt lookup and an assistant model, per row.

Both follow transformers' candidate generators (``PromptLookupCandidateGenerator``,
``AssistedCandidateGenerator``), for any batch size:

* :class:`PromptLookup` (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``): the last
  n tokens of the row (n from ``max_matching_ngram_size``, default 2, down to 1) are looked up
  in the row's own text (from its first attended column: left padding is not searched); the
  first earlier occurrence, left to right, whose continuation the processors (a mask such
  as ``no_repeat_ngram_size``, ``min_length``, ``bad_words_ids``, ``suppress_tokens``, a
  -inf ``sequence_bias``, or a user processor) allow from its first token on proposes up to
  ``prompt_lookup_num_tokens`` tokens, cut before an EOS. The drafts have no probabilities
  (q is one-hot).
* :class:`Assistant` (``assistant_model``): a model with the same vocabulary, on its own
  :class:`~gpu_sampler.hf.cache.StaticKVCache`, drafts one token per forward with the call's
  own processing (processors, single-token ones included, penalties, temperature / top-k /
  top-p / min-p, greedy or sampling, from an independent random stream), so its draft
  distribution q is ``sampling_distribution()`` of its processed logits. A row stops drafting
  after an EOS, after a token whose probability under the assistant's processed scores is below
  ``assistant_confidence_threshold``, or at its budget. ``num_assistant_tokens``,
  ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold`` are read from
  ``assistant_model.generation_config`` (transformers' defaults 20, ``"constant"``, 0.4 where
  it leaves them unset), as transformers 5.24 does; ``"heuristic"`` and
  ``"heuristic_transient"`` add 2 to a row's budget after a step that accepted every draft,
  else take 1 off (at least 1). Each row keeps its own budget; ``"heuristic"`` writes the
  budget reached back to the assistant's ``num_assistant_tokens`` at the end, as transformers
  does. transformers' threshold
  tuning (a ROC fit, only when scikit-learn is installed) is not done here.

Every row's budget is also capped so that no draft reaches ``max_length`` (the verification
step adds one token).
"""
import copy
import dataclasses
from typing import Any, Optional

import torch
from transformers.generation import logits_process as lp

from .. import rng
from ..reference import processed_logits_reference
from ..sampler import sample, sampling_distribution
from . import slots
from .buffers import Buffers
from .common import Unsupported
from .processors import TokenEdits

__all__ = ["Drafts", "Rows", "PromptLookup", "Assistant", "process_rows"]

# Mixed into the row seeds for the assistant's draws: its noise must be independent of the
# verification's, which uses the row seeds themselves at the same positions.
_DRAFT_STREAM = 0x5DEECE66D
_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


@dataclasses.dataclass(slots=True, eq=False)
class Drafts:
    """One step's draft tokens: row b proposes ``tokens[b, :lengths[b]]``."""
    tokens: torch.Tensor            # int64 [B, D] on the device (D = the longest draft)
    lengths: torch.Tensor           # int64 [B] on the host
    probs: Optional[torch.Tensor]   # float32 [B, D, V] the draft distributions, None = one-hot


@dataclasses.dataclass(slots=True, eq=False)
class Rows:
    """The batch at the start of a step, as the drafters and the verification read it."""
    out: torch.Tensor               # [B, cap] device: prompt + generated tokens per row
    hist: torch.Tensor              # [B, cap] device: penalty history (-1 = not counted)
    L0: int                         # prompt columns
    n: torch.Tensor                 # int64 [B] host: tokens row b generated so far
    live: torch.Tensor              # bool [B] host: rows still generating
    first: torch.Tensor             # int64 [B] host: row b's first attended prompt column
    limits: torch.Tensor            # int64 [B] host: most drafts row b may propose now
    offset: torch.Tensor            # int64 [B] device: position of the first token emitted now
    procs: lp.LogitsProcessorList   # the torch-side processors (plan.torch_procs)
    edits: TokenEdits               # the single-token processors (plan.edits)
    eos: Optional[torch.Tensor]     # EOS ids, or None

    def history(self, drafts, i):
        """[B, L + i] penalty history before draft i: the rows' history, then drafts[:, :i]."""
        width = self.L0 + int(self.n.max())
        return torch.cat([self.hist[:, :width], drafts[:, :i]], 1)


def process_rows(rows, drafts, i, scores):
    """Every processor before the penalties on scores [B, V] for the token after row b's
    sequence ``out[b, :L0 + n[b]]`` extended by ``drafts[b, :i]`` (live rows, grouped by
    length): see :func:`_processed`."""
    if not len(rows.procs) and rows.edits.empty:
        return scores
    dev = scores.device
    for length in rows.n[rows.live].unique().tolist():
        idx = ((rows.n == length) & rows.live).nonzero().flatten().to(dev)
        seq = torch.cat([rows.out[idx, :rows.L0 + length], drafts[idx, :i]], 1)
        scores[idx] = _processed(rows, seq, scores[idx], idx)
    return scores


def _for_rows(procs, idx):
    """`procs` for the batch rows `idx` only: transformers' processors with per-row state (the
    repetition penalty's ``prompt_ignore_length``, one entry per batch row under left padding)
    get that state's rows `idx`."""
    out, changed = [], False
    for p in procs:
        ignore = getattr(p, "prompt_ignore_length", None)
        if isinstance(p, lp.RepetitionPenaltyLogitsProcessor) and isinstance(ignore,
                                                                            torch.Tensor):
            p = copy.copy(p)
            p.prompt_ignore_length = ignore.to(idx.device)[idx]
            changed = True
        out.append(p)
    return lp.LogitsProcessorList(out) if changed else procs


def _processed(rows, seq, scores, idx):
    """float32 scores [b, V] for the token after ``seq`` [b, L]: the torch-side processors,
    then the single-token ones (sample()'s logit_bias in plain generate(), here added to the
    scores: they depend on the length L, which differs between positions and rows, and every
    consumer of a position's scores (verification, reported scores, the assistant's draw, q
    and confidence, prompt lookup's check) must see them, as transformers' processors see
    them). Both act before the penalties, as in plain generate()."""
    if len(rows.procs):
        procs = rows.procs if seq.shape[0] == rows.out.shape[0] else _for_rows(rows.procs, idx)
        scores = procs(seq, scores)
    return rows.edits.apply(scores, seq.shape[1])


def _positive_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclasses.dataclass(slots=True, eq=False)
class PromptLookup:
    """Drafts from the row's own text (``prompt_lookup_num_tokens``)."""
    num_tokens: int
    max_ngram: int
    vocab: int

    @classmethod
    def from_config(cls, gc, vocab):
        return cls(_positive_int("prompt_lookup_num_tokens", gc.prompt_lookup_num_tokens, 1),
                   _positive_int("max_matching_ngram_size", gc.max_matching_ngram_size or 2, 1),
                   vocab)

    def budget(self, B):
        return torch.full((B,), self.num_tokens, dtype=torch.long)

    def prefill(self, seeds):
        """Nothing to prepare."""

    def propose(self, rows):
        host = rows.out[:, :rows.L0 + int(rows.n.max())].cpu()
        found = [self._row(rows, host, b) if rows.limits[b] > 0 else [] for b in
                 range(host.shape[0])]
        width = max(len(f) for f in found)
        tokens = torch.zeros(host.shape[0], width, dtype=torch.long)
        for b, f in enumerate(found):
            tokens[b, :len(f)] = torch.tensor(f, dtype=torch.long)
        lengths = torch.tensor([len(f) for f in found], dtype=torch.long)
        return Drafts(tokens.to(rows.out.device), lengths, None)

    def _row(self, rows, host, b):
        """Row b's drafts (a list of ids), as transformers' prompt lookup finds them."""
        seq = host[b, int(rows.first[b]):rows.L0 + int(rows.n[b])]
        for cand in _continuations(seq, self.num_tokens, self.max_ngram):
            cand = self._allowed(rows, b, cand)
            if not cand:
                continue
            if rows.eos is not None:
                eos = set(rows.eos.tolist())
                cand = cand[:next((j for j, t in enumerate(cand) if t in eos), len(cand))]
            return cand[:int(rows.limits[b])]
        return []

    def _allowed(self, rows, b, cand):
        """The leading candidates the processors before the penalties (torch-side and
        single-token) do not forbid (-inf) on flat logits, each after the ones before it
        (transformers' check, which runs its whole processor list)."""
        if not len(rows.procs) and rows.edits.empty:
            return cand
        seq = rows.out[b:b + 1, :rows.L0 + int(rows.n[b])]
        dev = seq.device
        for j, tok in enumerate(cand):
            s = _processed(rows, torch.cat([seq, torch.tensor([cand[:j]], dtype=torch.long,
                                                              device=dev)], 1),
                           torch.ones(1, self.vocab, device=dev),
                           torch.tensor([b], device=dev))[0, tok]
            if s == float("-inf") or s == torch.finfo(s.dtype).min:
                return cand[:j]
        return cand

    def settle(self, rows, emitted, counts):
        """Nothing to roll back."""

    def update(self, lengths, counts, live):
        """prompt_lookup_num_tokens stays."""

    def finish(self):
        """Nothing to write back."""


def _continuations(seq, num_tokens, max_ngram):
    """Candidate continuations (lists of ids) of `seq` (1-D host tensor) in transformers'
    order: n-gram sizes from the largest down; for each, every occurrence of the last n tokens,
    left to right, proposes what followed it (at most num_tokens, within seq)."""
    L = seq.shape[0]
    for size in range(min(max_ngram, L - 1), 0, -1):
        hits = (seq.unfold(0, size, 1) == seq[L - size:]).all(1).nonzero().flatten().tolist()
        for idx in hits:
            start = idx + size
            end = min(start + num_tokens, L)
            if start < end:
                yield seq[start:end].tolist()


@dataclasses.dataclass(slots=True, eq=False)
class Assistant:
    """The assistant model drafting beside the target, on its own cache and buffers.

    Between steps its cache holds each row's sequence except the ``pending`` tokens (1 or 2:
    the token the target emitted last, and the last draft when every draft was accepted); a
    step feeds those, then one draft per forward, and :meth:`settle` rolls back the drafts the
    target rejected (:func:`gpu_sampler.hf.slots.settle`).
    """
    model: Any
    plan: Any                       # the target's Plan with the assistant's forward details
    bufs: Buffers
    K: torch.Tensor                 # int64 [B] host: num_assistant_tokens per row
    schedule: str
    threshold: float
    sampling: bool
    params: dict                    # sample() parameters, seed excluded
    ref_kw: dict                    # the same for processed scores (confidence when greedy)
    seeds: Optional[torch.Tensor] = None     # int64 [B] device: the draft stream
    pending: Optional[torch.Tensor] = None   # int64 [B, 2] device
    n_pending: Optional[torch.Tensor] = None  # int64 [B] host
    start: int = 0                  # first slot of this step's fed drafts
    start_pos: Optional[torch.Tensor] = None  # next_pos at `start`
    fed: int = 0                    # drafts fed this step
    skip: int = 0                   # prompt positions the next feed carries first

    @classmethod
    def create(cls, assistant, plan, assistant_plan):
        """Read its generation_config and allocate its buffers (refusing what it cannot run)."""
        agc = assistant.generation_config
        schedule = agc.num_assistant_tokens_schedule or "constant"
        if schedule not in _SCHEDULES:
            raise ValueError(f"num_assistant_tokens_schedule must be one of {_SCHEDULES}, got "
                             f"{schedule!r}")
        k = agc.num_assistant_tokens
        k = _positive_int("num_assistant_tokens", 20 if k is None else k, 0)
        threshold = agc.assistant_confidence_threshold
        threshold = 0.4 if threshold is None else float(threshold)
        bufs = Buffers.allocate(assistant, assistant_plan)
        if not bufs.own:
            raise Unsupported(f"assistant_model {type(assistant).__name__} (its cache is not a "
                              f"StaticKVCache)")
        kw = {k2: v for k2, v in plan.sample_kw.items() if k2 != "seed"}
        return cls(assistant, assistant_plan, bufs, torch.full((plan.inputs.B,), k),
                   schedule, threshold, bool(plan.gc.do_sample), kw, dict(plan.ref_kw))

    def budget(self, B):
        return self.K

    def prefill(self, seeds):
        """The prompt is pending: the first feed carries it. `seeds`: the row seeds."""
        inp = self.plan.inputs
        self.seeds = rng.splitmix64(seeds ^ _DRAFT_STREAM)
        self.skip = inp.P - 1
        self.bufs.next_pos = self.bufs.next_pos - 1
        self.pending = inp.input_ids[:, -1:].repeat(1, 2)
        self.n_pending = torch.ones(inp.B, dtype=torch.long)

    @property
    def live(self):
        return self.n_pending > 0

    def _sync(self):
        """Feed the pending tokens: the logits [B, V] after each row's whole sequence."""
        skip, keep = self.skip, self.n_pending
        start, self.skip = self.bufs.kv + skip, 0
        ids = torch.cat([self.plan.inputs.input_ids[:, :skip],
                         self.pending[:, :int(keep.max())]], 1)
        logits = slots.feed(self.model, self.plan, self.bufs, ids, skip)
        slots.settle(self.bufs, start, keep, self.live)
        dev = logits.device
        self.bufs.next_pos = self.bufs.next_pos + keep.to(dev)
        return logits[torch.arange(logits.shape[0], device=dev), (keep - 1).clamp_min(0).to(dev)]

    def _draw(self, rows, scores, tokens, i):
        """(token [B], q [B, V] or None, confidence [B] or None) for draft i."""
        scores = process_rows(rows, tokens, i, scores)
        hist = rows.history(tokens, i)
        tok = sample(scores, input_ids=hist, prompt_lens=rows.L0, seed=self.seeds,
                     offset=rows.offset + i, check=False, **self.params)
        q = None
        if self.sampling:
            q = sampling_distribution(scores, input_ids=hist, prompt_lens=rows.L0, check=False,
                                      **self.params)
        conf = None
        if self.threshold > 0:
            probs = q if q is not None else torch.softmax(processed_logits_reference(
                scores, input_ids=hist, prompt_lens=rows.L0, **self.ref_kw), -1)
            conf = probs.gather(1, tok.clamp_min(0)[:, None]).squeeze(1)
        return tok, q, conf

    def _stops(self, tok, conf, rows):
        """bool [B] host: rows whose draft ends with `tok` (EOS, low confidence), or with no
        valid token (then `tok` is not a draft: second value False)."""
        flags = [tok >= 0]
        flags.append(torch.isin(tok, rows.eos) if rows.eos is not None else tok < -1)
        flags.append(conf < self.threshold if conf is not None else tok < -1)
        ok, eos, unsure = torch.stack(flags).cpu()
        return ~ok | eos | unsure, ok

    def propose(self, rows):
        logits = self._sync()
        B, D = logits.shape[0], int(rows.limits.max())
        dev = logits.device
        tokens = torch.zeros(B, D, dtype=torch.long, device=dev)
        probs = torch.zeros(B, D, logits.shape[1], device=dev) if self.sampling and D else None
        lengths = torch.zeros(B, dtype=torch.long)
        active = rows.limits > 0
        self.start, self.start_pos, self.fed = self.bufs.kv, self.bufs.next_pos.clone(), 0
        for i in range(D):
            tok, q, conf = self._draw(rows, logits, tokens, i)
            tokens[:, i] = tok.clamp_min(0)
            if probs is not None:
                probs[:, i] = q
            stop, ok = self._stops(tok, conf, rows)
            lengths += (active & ok).long()
            active &= ~stop & (lengths < rows.limits)
            if not bool(active.any()):
                break
            logits = slots.feed(self.model, self.plan, self.bufs, tokens[:, i:i + 1])[:, 0]
            self.bufs.next_pos = self.bufs.next_pos + 1
            self.fed += 1
        width = int(lengths.max())
        return Drafts(tokens[:, :width], lengths,
                      None if probs is None else probs[:, :width].contiguous())

    def settle(self, rows, emitted, counts):
        """Roll back the drafts the target did not emit; the emitted tokens not fed yet
        become pending. `emitted` int64 [B, W] host (-1 padded), `counts` [B] host."""
        keep = torch.minimum(counts - 1, torch.full_like(counts, self.fed)).clamp_min(0)
        slots.settle(self.bufs, self.start, keep, rows.live)
        dev = self.bufs.next_pos.device
        self.bufs.next_pos = self.start_pos + keep.to(dev)
        idx = (keep[:, None] + torch.arange(2)).clamp(max=emitted.shape[1] - 1)
        self.pending = emitted.gather(1, idx).clamp_min(0).to(dev)
        # Finished rows (nothing emitted) feed nothing that counts: 0 pending.
        self.n_pending = torch.where(counts > 0, counts - keep, 0)

    def update(self, lengths, counts, live):
        """The heuristic schedule: +2 after a step that accepted every draft, else -1."""
        if self.schedule == "constant":
            return
        full = (counts - 1) == lengths
        self.K = torch.where(live, torch.where(full, self.K + 2, (self.K - 1).clamp_min(1)),
                             self.K)

    def finish(self):
        """As transformers ends an assisted generate: under ``"heuristic"`` (not
        ``"heuristic_transient"``) the budget reached is written back to the assistant's
        ``generation_config.num_assistant_tokens``, so the next call starts from it
        (transformers runs batch size 1; with several rows, row 0's budget)."""
        if self.schedule == "heuristic":
            self.model.generation_config.num_assistant_tokens = int(self.K[0])
