"""generate(assistant_model=...) / generate(prompt_lookup_num_tokens=...): assisted generation.

Greedy: token-identical to transformers' assisted generate (which equals plain greedy) at
batch size 1, and at batch size > 1 (which transformers refuses) each row equals plain greedy
(ours, and transformers' on the row alone), with left padding, EOS and stopping criteria that
stop rows in the middle of a verified block. Sampling: exact in distribution (chi-square on
the first and second tokens over many seeded rows), and an assistant identical to the target
has every draft accepted. Rollback: the returned cache equals plain generate's. The
single-token processors (plain generate() hands them to sample() as logit_bias) reach the
target's verified positions and the assistant's drafts, as transformers applies them to both.
"""
import copy
import warnings

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import gpu_sampler
from gpu_sampler.hf import slots
from gpu_sampler.hf.drafts import Assistant
from gpu_sampler.hf.generation import generate
from gpu_sampler.hf.patch import patch
from tests.chisq import pvalue
from tests.models import Recorder, tiny_model
from tests.test_seq2seq import tiny_seq2seq

V = 1000


def _assistant(target, layers=1):
    """A smaller draft: the target's first `layers` layers, embeddings and head (it agrees with
    the target often enough for rows to accept different counts)."""
    arch = target.config.model_type
    a = tiny_model(arch, seed=0, num_layers=layers, vocab_size=target.config.vocab_size)
    a.load_state_dict(target.state_dict(), strict=False)
    a.generation_config.assistant_confidence_threshold = 0.0
    a.generation_config.num_assistant_tokens = 4
    return a


def _batch(B=4, L=9, seed=0, vocab=40):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, L), generator=g)
    ids[:, L // 2:] = ids[:, :L - L // 2]  # repeated text: prompt lookup finds matches
    mask = torch.ones_like(ids)
    for b in range(1, B):
        mask[b, :2 * b] = 0
    return ids.masked_fill(mask == 0, 0), mask


class _Counter:
    """Counts a model's forward calls."""

    def __init__(self, model):
        self.n = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.n += 1


@pytest.fixture
def packs(monkeypatch):
    """How often the slots of rows that kept different counts were packed."""
    seen = []
    original = slots.compact

    def spy(bufs):
        seen.append(bufs.kv)
        return original(bufs)

    monkeypatch.setattr(slots, "compact", spy)
    return seen


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_equals_transformers_batch_1(arch):
    target = tiny_model(arch, seed=3)
    assistant = _assistant(target)
    ids = _batch(1, 12, seed=1)[0]
    for kw in (dict(assistant_model=assistant), dict(prompt_lookup_num_tokens=3)):
        ref = target.generate(ids, max_new_tokens=23, do_sample=False, **kw)
        assert torch.equal(generate(target, ids, max_new_tokens=23, do_sample=False, **kw), ref)
    assert torch.equal(ref, target.generate(ids, max_new_tokens=23, do_sample=False))


def _eos_mid_generation(target, ids, mask):
    """An EOS id that plain greedy emits in the middle of row 0: rows stop at different
    steps."""
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                     eos_token_id=None)
    return int(plain[0, ids.shape[1] + 9])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_rows_equal_plain_greedy(arch, packs):
    target = tiny_model(arch, seed=5)
    ids, mask = _batch(4, 10, seed=2)
    eos = _eos_mid_generation(target, ids, mask)
    kw = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos,
              pad_token_id=0)
    ref = generate(target, ids, **kw)
    assert torch.equal(ref, target.generate(ids, **kw))
    assert (ref[:, -1] == 0).any(), "no row stopped early"
    for extra in (dict(assistant_model=_assistant(target)), dict(prompt_lookup_num_tokens=3)):
        assert torch.equal(generate(target, ids, **extra, **kw), ref)
    assert packs, "rows never kept different counts"
    # Each row as transformers generates it alone (no padding, no batch).
    for b in range(ids.shape[0]):
        alone = ids[b, mask[b] == 1][None]
        row = target.generate(alone, max_new_tokens=24, do_sample=False, eos_token_id=eos,
                              pad_token_id=0)[0, alone.shape[1]:]
        assert torch.equal(ref[b, ids.shape[1]:ids.shape[1] + len(row)], row)


class _Ramp:
    """A user logits processor (it moves the repetition penalty to the torch side)."""

    def __call__(self, input_ids, scores):
        return scores + torch.linspace(0, 1, scores.shape[-1])


def test_batched_rows_with_left_padding_and_a_torch_side_penalty(packs):
    """transformers' repetition-penalty processor holds one prompt_ignore_length per batch row
    under left padding; the drafters ran it on a subset of the rows, which it refused with a
    ValueError (found by fuzzing): each group of rows gets its own entries."""
    from transformers import LogitsProcessorList

    target = tiny_model("llama", seed=5)
    ids, mask = _batch(4, 10, seed=2)
    kw = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=None,
              repetition_penalty=1.3)
    ref = target.generate(ids, logits_processor=LogitsProcessorList([_Ramp()]), **kw)
    for extra in (dict(assistant_model=_assistant(target)), dict(prompt_lookup_num_tokens=3)):
        out = generate(target, ids, logits_processor=LogitsProcessorList([_Ramp()]), **extra,
                       **kw)
        assert torch.equal(out, ref)
    assert packs, "rows never kept different counts"


class _StopAfter(StoppingCriteria):
    """Stops a row once token `tok` was generated."""

    def __init__(self, tok, L0):
        self.tok, self.L0 = tok, L0

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, self.L0:] == self.tok).any(1)


def test_stopping_criteria_and_max_new_tokens_mid_draft():
    target = tiny_model("llama", seed=5)
    assistant = target  # every draft accepted: stops fall inside verified blocks
    assistant.generation_config.assistant_confidence_threshold = 0.0
    assistant.generation_config.num_assistant_tokens = 6
    ids, mask = _batch(3, 10, seed=4)
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=19, do_sample=False)
    stop = StoppingCriteriaList([_StopAfter(int(plain[1, 10 + 7]), 10)])
    for B in (1, 3):
        kw = dict(attention_mask=mask[:B], max_new_tokens=19, do_sample=False,
                  stopping_criteria=stop)
        ref = generate(target, ids[:B], **kw)
        out = generate(target, ids[:B], assistant_model=assistant, **kw)
        assert torch.equal(out, ref)
    assert out.shape[1] == 10 + 19 or not stop[0](out, None).all()


class _Spy(StoppingCriteria):
    """Records each call's (generated length, scores argument); never stops a row."""

    def __init__(self, L0):
        self.L0, self.calls = L0, []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append((input_ids.shape[1] - self.L0, scores))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@pytest.mark.parametrize("report", [False, True])
def test_stopping_criteria_get_what_transformers_hands_them(report):
    # transformers hands criteria the processed scores so far (a tuple of [B, V]) under
    # return_dict_in_generate + output_scores, else None; here per row and per emitted token.
    target = tiny_model("llama", seed=5)
    ids, _ = _batch(1, 10, seed=4)
    spy = _Spy(10)
    out = generate(target, ids, assistant_model=_assistant(target), max_new_tokens=9,
                   do_sample=False, stopping_criteria=StoppingCriteriaList([spy]),
                   return_dict_in_generate=True, output_scores=report)
    assert [n for n, _ in spy.calls] == list(range(1, 10))
    for n, scores in spy.calls:
        if not report:
            assert scores is None
            continue
        assert isinstance(scores, tuple) and len(scores) == n
        for a, b in zip(scores, out.scores):
            assert torch.equal(a, b)



def test_returned_cache_equals_plain_generate(packs):
    target = tiny_model("llama", seed=5)
    ids, mask = _batch(3, 10, seed=2)
    kw = dict(attention_mask=mask, max_new_tokens=15, do_sample=False,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    ref = generate(target, ids, **kw)
    out = generate(target, ids, assistant_model=_assistant(target), **kw)
    assert packs
    assert torch.equal(out.sequences, ref.sequences)
    L = ids.shape[1] + len(ref.scores) - 1
    for mine, theirs in zip(out.past_key_values.layers, ref.past_key_values.layers):
        assert mine.keys.shape == theirs.keys.shape and mine.keys.shape[2] == L
        used = mask.bool()[:, None, :, None].expand(-1, 1, -1, 1)
        prompt_and_new = torch.cat([used, torch.ones(3, 1, L - 10, 1, dtype=torch.bool)], 2)
        torch.testing.assert_close(mine.keys * prompt_and_new, theirs.keys * prompt_and_new,
                                   atol=1e-5, rtol=0)
    for name in ("scores", "logits"):
        assert len(getattr(out, name)) == len(getattr(ref, name))
        for a, b in zip(getattr(out, name), getattr(ref, name)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_identical_assistant_accepts_every_draft_when_sampling():
    target = tiny_model("llama", seed=7)
    target.generation_config.assistant_confidence_threshold = 0.0
    target.generation_config.num_assistant_tokens = 4
    calls = _Counter(target)
    ids, mask = _batch(2, 8, seed=3)
    out = generate(target, ids, attention_mask=mask, assistant_model=target, do_sample=True,
                   temperature=0.8, top_k=50, max_new_tokens=20, min_new_tokens=20, seed=1)
    assert out.shape == (2, 28)
    # Target: 4 steps of 5 tokens (the first with the prompt); assistant: 4 x (the tokens it
    # has not seen + 3 drafts fed).
    assert calls.n == 4 + 4 * 4


def test_seeded_sampled_rows_equal_the_row_alone():
    # A row's draws depend on its seed and positions only: not on the batch, its padding or
    # how many drafts the other rows accepted.
    target = tiny_model("llama", seed=5)
    ids, mask = _batch(3, 9, seed=6)
    seeds = torch.tensor([11, 22, 33])
    kw = dict(max_new_tokens=14, do_sample=True, temperature=0.7, top_k=30, seed=seeds,
              repetition_penalty=1.2, presence_penalty=0.3)
    for extra in (dict(assistant_model=_assistant(target)), dict(prompt_lookup_num_tokens=3)):
        out = generate(target, ids, attention_mask=mask, **extra, **kw)
        for b in range(3):
            alone = ids[b, mask[b] == 1][None]
            row = generate(target, alone, **extra, **dict(kw, seed=seeds[b:b + 1]))
            assert torch.equal(row[0, alone.shape[1]:], out[b, 9:9 + row.shape[1] -
                                                            alone.shape[1]])


def _first_tokens(target, ids, n, **kw):
    out = generate(target, ids.expand(n, -1), max_new_tokens=3, do_sample=True, seed=0, **kw)
    return out[:, ids.shape[1]], out[:, ids.shape[1] + 1]


@pytest.mark.parametrize("mode", ["assistant", "prompt_lookup"])
def test_sampled_tokens_follow_the_target_distribution(mode):
    target = tiny_model("llama", seed=2, vocab_size=24)
    with torch.no_grad():  # a peakier target: p_0 spread over ~12 tokens, drafts of either
        target.lm_head.weight.mul_(3)  # kind accepted in 10-50% of the rows
    params = dict(temperature=0.9, top_k=12, repetition_penalty=1.3)
    ids = torch.tensor([[5, 9, 1, 4, 5, 9, 1, 4, 5, 9]])
    if mode == "assistant":
        kw = dict(assistant_model=_assistant(target))
    else:
        kw = dict(prompt_lookup_num_tokens=2)
    first, second = _first_tokens(target, ids, 3000, eos_token_id=None, **kw, **params)
    logits = target(ids).logits[:, -1]
    p0 = gpu_sampler.sampling_distribution(logits, input_ids=ids, **params)[0]
    assert pvalue(first, p0) > 1e-3
    t = int(torch.bincount(first).argmax())
    ext = torch.cat([ids, torch.tensor([[t]])], 1)
    p1 = gpu_sampler.sampling_distribution(target(ext).logits[:, -1], input_ids=ext, **params)[0]
    assert pvalue(second[first == t], p1) > 1e-3


def test_heuristic_schedule_adds_two_or_takes_one(monkeypatch):
    budgets = []
    original = Assistant.propose

    def spy(self, rows):
        budgets.append(int(rows.limits[0]))
        return original(self, rows)

    monkeypatch.setattr(Assistant, "propose", spy)
    target = tiny_model("llama", seed=5)
    ids = _batch(1, 10, seed=4)[0]
    agc = target.generation_config
    agc.num_assistant_tokens_schedule, agc.num_assistant_tokens = "heuristic", 2
    agc.assistant_confidence_threshold = 0.0
    generate(target, ids, assistant_model=target, max_new_tokens=30, do_sample=False)
    assert budgets == [2, 4, 6, 8, 5]  # all accepted; the last capped by max_length (30 - 24 - 1)
    # "heuristic" writes the budget reached back, as transformers does (utils.py, end of
    # _assisted_decoding); "heuristic_transient" leaves the config as it was.
    assert agc.num_assistant_tokens == 12
    budgets.clear()
    other = tiny_model("llama", seed=9)  # disagrees: every step rejects
    other.generation_config.num_assistant_tokens_schedule = "heuristic"
    other.generation_config.num_assistant_tokens = 3
    other.generation_config.assistant_confidence_threshold = 0.0
    generate(target, ids, assistant_model=other, max_new_tokens=6, do_sample=False)
    assert budgets[:4] == [3, 2, 1, 1]


@pytest.mark.parametrize("schedule", ["heuristic", "heuristic_transient", "constant"])
def test_heuristic_budget_written_back_as_transformers(schedule):
    target = tiny_model("llama", seed=5)
    ids = _batch(1, 10, seed=4)[0]
    left = []
    for run in (target.generate, lambda *a, **k: generate(target, *a, **k)):
        a = tiny_model("llama", seed=5)  # the target itself: every draft accepted
        agc = a.generation_config
        agc.num_assistant_tokens_schedule, agc.num_assistant_tokens = schedule, 2
        agc.assistant_confidence_threshold = 0.0
        run(ids, assistant_model=a, max_new_tokens=20, do_sample=False)
        left.append(agc.num_assistant_tokens)
    assert left[0] == left[1]
    assert (left[0] != 2) == (schedule == "heuristic")


def test_streamer_gets_each_verified_block():
    target = tiny_model("llama", seed=5)
    ids = _batch(1, 10, seed=4)[0]
    rec = Recorder()
    out = generate(target, ids, prompt_lookup_num_tokens=4, max_new_tokens=16,
                   do_sample=False, streamer=rec)
    assert rec.calls[-1] == "end" and torch.equal(rec.calls[0], ids)
    assert torch.equal(torch.cat(rec.calls[1:-1], 1), out[:, 10:])


def test_refused_and_invalid_calls():
    target = tiny_model("llama", seed=5)
    ids = _batch(1, 6)[0]
    draft = _assistant(target)
    for kw, match in ((dict(assistant_tokenizer=object(), tokenizer=object()),
                       "assistant_tokenizer"),
                      (dict(output_attentions=True, return_dict_in_generate=True),
                       "output_attentions"),
                      (dict(num_beams=2), "num_beams"),
                      (dict(use_cache=False), "use_cache")):
        with pytest.raises(NotImplementedError, match=match):
            generate(target, ids, assistant_model=draft, max_new_tokens=4, **kw)
    with pytest.raises(NotImplementedError, match="streamer"):
        generate(target, ids.repeat(2, 1), prompt_lookup_num_tokens=2, max_new_tokens=4,
                 streamer=Recorder())
    with pytest.raises(ValueError, match="different tokenizers"):
        generate(target, ids, assistant_model=tiny_model("llama", vocab_size=V + 1),
                 max_new_tokens=4)
    with pytest.raises(ValueError, match="num_return_sequences"):
        generate(target, ids, assistant_model=draft, do_sample=True, num_return_sequences=2,
                 max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        generate(target, ids, prompt_lookup_num_tokens=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="assistant_model"):
        generate(target, ids, assistant_model="x", max_new_tokens=4)


def test_patch_runs_it_and_hands_over_what_it_refuses():
    target = tiny_model("llama", seed=5)
    ids = _batch(1, 8, seed=1)[0]
    draft = _assistant(target)
    ours = generate(target, ids, assistant_model=draft, max_new_tokens=6, do_sample=False)
    patch(target)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert torch.equal(target.generate(ids, assistant_model=draft, max_new_tokens=6,
                                           do_sample=False), ours)
        target.generate(ids, prompt_lookup_num_tokens=2, num_beams=2, max_new_tokens=4)
    messages = [str(w.message) for w in record if "gpu_sampler" in str(w.message)]
    assert len(messages) == 1 and "num_beams" in messages[0]
    t5 = tiny_seq2seq("t5")
    src = torch.randint(3, 50, (1, 5))
    for kw in (dict(assistant_model=t5), dict(prompt_lookup_num_tokens=2)):
        with pytest.raises(NotImplementedError):
            generate(t5, src, max_new_tokens=4, **kw)


# ---- single-token processors (plain generate()'s logit_bias) on the assisted path ------------

def _edit_cases(free):
    """suppress_tokens, begin_suppress_tokens, single-token bad_words_ids and sequence_bias,
    min_new_tokens: built from a free greedy run's tokens so that each changes the output."""
    a, b, c = int(free[1]), int(free[4]), int(free[0])
    return {
        "suppress": dict(suppress_tokens=[a, b]),
        "begin_suppress": dict(begin_suppress_tokens=[c]),
        "bad_words": dict(bad_words_ids=[[a], [b, 7]]),  # the longer word stays in torch
        "seq_bias": dict(sequence_bias={(a,): -4.0, (c,): -3.0, (17,): 2.5}),
        "min_new_tokens": dict(min_new_tokens=8, eos_token_id=a),
    }


EDIT_CASES = ("suppress", "begin_suppress", "bad_words", "seq_bias", "min_new_tokens")


def _drafter(target, mode):
    if mode == "prompt_lookup":
        return dict(prompt_lookup_num_tokens=3)
    if mode == "assistant":
        return dict(assistant_model=_assistant(target))
    # An identical assistant accepts every draft only if it applies the processors as the
    # target does: the forward counts below tell.
    twin = copy.deepcopy(target)
    twin.generation_config.assistant_confidence_threshold = 0.0
    twin.generation_config.num_assistant_tokens = 4
    return dict(assistant_model=twin)


def _greedy_kw(case_kw, **extra):
    kw = dict(case_kw, max_new_tokens=16, do_sample=False, pad_token_id=0, **extra)
    kw.setdefault("eos_token_id", None)
    return kw


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant", "twin"])
@pytest.mark.parametrize("case", EDIT_CASES)
def test_single_token_processors_greedy_equal_transformers(case, mode):
    target = tiny_model("llama", seed=3)
    ids = _batch(1, 12, seed=1)[0]
    free = target.generate(ids, **_greedy_kw({}))[0, 12:]
    kw = _greedy_kw(_edit_cases(free)[case], **_drafter(target, mode))
    calls = _Counter(target)
    ref = target.generate(ids, **kw)
    hf_calls, calls.n = calls.n, 0
    out = generate(target, ids, **kw)
    assert not torch.equal(ref[0, 12:], free[:ref.shape[1] - 12]), "the case changes nothing"
    assert torch.equal(out, ref)
    # Same drafts, same acceptances: prompt lookup drops the candidates the processors ban and
    # the assistant drafts under them, as transformers' candidate generators do.
    assert calls.n == hf_calls


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant"])
def test_single_token_processors_batched_rows_equal_plain_greedy(mode, packs):
    target = tiny_model("llama", seed=5)
    ids, mask = _batch(3, 10, seed=2)
    free = generate(target, ids, **_greedy_kw({}, attention_mask=mask))
    for case, case_kw in _edit_cases(free[0, 10:]).items():
        kw = _greedy_kw(case_kw, attention_mask=mask)
        ref = target.generate(ids, **kw)
        assert not torch.equal(ref, free), case
        assert torch.equal(generate(target, ids, **kw), ref), case
        assert torch.equal(generate(target, ids, **_drafter(target, mode), **kw), ref), case
    if mode == "assistant":
        assert packs, "rows never kept different counts (per-row lengths untested)"


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant", "twin"])
def test_sampling_never_emits_a_banned_token(mode):
    target = tiny_model("llama", seed=2, vocab_size=24)
    with torch.no_grad():  # a peakier target: a few tokens take most of the mass
        target.lm_head.weight.mul_(3)
    ids = torch.tensor([[5, 9, 1, 4, 5, 9, 1, 4, 5, 9]]).expand(64, -1)
    kw = dict(max_new_tokens=8, do_sample=True, temperature=1.0, seed=0, pad_token_id=0,
              **_drafter(target, mode))
    free = generate(target, ids, eos_token_id=None, **kw)[:, 10:]
    # Token 0 is the pad that rows stopped by EOS are filled with: never a banned one.
    common = [t for t in torch.bincount(free.flatten(), minlength=24).argsort(
        descending=True).tolist() if t != 0]
    first = torch.bincount(free[:, 0], minlength=24)[1:].argmax().item() + 1
    suppressed, bad, eos = common[:2], common[2], common[3]
    assert all(bool((free == t).any()) for t in common[:4]) and bool((free[:, 0] == first).any())
    out = generate(target, ids, suppress_tokens=suppressed, bad_words_ids=[[bad]],
                   begin_suppress_tokens=[first], min_new_tokens=5, eos_token_id=eos,
                   **kw)[:, 10:]
    assert not bool(torch.isin(out, torch.tensor(suppressed + [bad])).any())
    assert not bool((out[:, 0] == first).any())
    assert not bool((out[:, :5] == eos).any())


@pytest.mark.parametrize("ban", [dict(suppress_tokens=[8]), dict(bad_words_ids=[[8], [3, 4]]),
                                 dict(sequence_bias={(8,): float("-inf")}),
                                 dict(suppress_tokens=[7]), dict(begin_suppress_tokens=[7])])
def test_prompt_lookup_candidates_equal_transformers_under_bans(ban, monkeypatch):
    """transformers' prompt lookup cuts a candidate before its first token the processors ban
    (the whole list, single-token ones included) and looks further when nothing is left."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
    from gpu_sampler.hf.drafts import PromptLookup
    theirs, ours = [], []
    hf_get, our_propose = PromptLookupCandidateGenerator.get_candidates, PromptLookup.propose

    def hf_spy(self, input_ids, **kw):
        cand, logits = hf_get(self, input_ids, **kw)
        theirs.append(cand[0, input_ids.shape[1]:].tolist())
        return cand, logits

    def our_spy(self, rows):
        drafts = our_propose(self, rows)
        ours.append(drafts.tokens[0, :int(drafts.lengths[0])].tolist())
        return drafts

    monkeypatch.setattr(PromptLookupCandidateGenerator, "get_candidates", hf_spy)
    monkeypatch.setattr(PromptLookup, "propose", our_spy)
    target = tiny_model("llama", seed=3)
    ids = torch.tensor([[5, 6, 7, 8, 9, 4, 5, 6, 7, 8, 9, 4, 5, 6]])
    kw = dict(ban, max_new_tokens=8, do_sample=False, pad_token_id=0)
    kw.setdefault("eos_token_id", None)
    ref = target.generate(ids, prompt_lookup_num_tokens=3, **kw)
    assert torch.equal(generate(target, ids, prompt_lookup_num_tokens=3, **kw), ref)
    assert ours == theirs and any(ours)


def test_reported_scores_carry_the_single_token_processors():
    # output_scores: each emitted token's processed scores, bans and bias included, as plain
    # generate() reports them (rows at different lengths, so different eos bans).
    target = tiny_model("llama", seed=5)
    ids, mask = _batch(3, 10, seed=2)
    kw = _greedy_kw(dict(suppress_tokens=[886, 5], sequence_bias={(17,): 2.0},
                         min_new_tokens=4, eos_token_id=2), attention_mask=mask,
                    return_dict_in_generate=True, output_scores=True)
    ref = generate(target, ids, **kw)
    for extra in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=_assistant(target))):
        out = generate(target, ids, **extra, **kw)
        assert torch.equal(out.sequences, ref.sequences)
        assert len(out.scores) == len(ref.scores)
        for a, b in zip(out.scores, ref.scores):
            assert torch.equal(a.isinf(), b.isinf())
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_prompt_lookup_sampling_emits_plain_sampling_tokens():
    """Drafts without probabilities are verified by sampling each position with its own
    stream (gpu_sampler/speculative.py): with the same seed, prompt lookup emits exactly the
    tokens plain sampling does, batched, with per-row prompts, top-k and min-p."""
    target = tiny_model("llama", seed=5)
    ids, mask = _batch(4, 10, seed=2)
    kw = dict(attention_mask=mask, max_new_tokens=24, do_sample=True, temperature=0.05,
              top_k=30, min_p=0.02, seed=9, pad_token_id=0)
    plain = generate(target, ids, **kw)
    calls = _Counter(target)
    assert torch.equal(generate(target, ids, prompt_lookup_num_tokens=3, **kw), plain)
    assert calls.n < 24, "no draft was accepted"
