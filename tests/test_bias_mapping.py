"""generate() hands transformers' single-token processors to sample() as logit_bias.

sequence_bias with single-token keys, bad_words_ids of one token, suppress_tokens,
begin_suppress_tokens and the eos ban of min_length / min_new_tokens become sample()'s
``logit_bias`` (gpu_sampler/hf/processors.py, TokenEdits) instead of transformers' processors in
torch. Checked here: token-identical greedy output and equal processed scores against
model.generate, per-step scores equal to transformers' chain under sampling, which processors
still run in torch, and the sample() semantics the mapping relies on.
"""
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as lp

import gpu_sampler
from gpu_sampler.hf.generation import generate
from tests.models import left_padded, tiny_model
from tests.test_seq2seq import tiny_seq2seq

V = 1000


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=11)


@pytest.fixture(scope="module")
def prompts():
    """Left-padded prompts of lengths 7, 3, 5: (ids, mask)."""
    return left_padded((7, 3, 5), 4, V)


@pytest.fixture(scope="module")
def free(model, prompts):
    """The greedy tokens without processors [B, 10]: what the cases bias, ban or end on."""
    ids, mask = prompts
    out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[:, ids.shape[1]:]


def _cases(free):
    """generate() arguments built from the free run's tokens, so that each one matters."""
    a, b, c = (int(free[0, 1]), int(free[1, 2]), int(free[2, 0]))
    nxt = (int(free[0, 2]), int(free[0, 3]))    # completes the 2-token word (a, nxt[0]), ...
    return {
        "seq_bias": dict(sequence_bias={(a,): -2.75, (b,): -1.3, (17,): 3.1}),
        "seq_bias_rp": dict(sequence_bias={(a,): 1.7, (b,): -0.9, (c,): 2.3},
                            repetition_penalty=1.6),
        "seq_bias_-inf": dict(sequence_bias={(a,): float("-inf"), (b,): 0.6}),
        "seq_bias_multi_rp": dict(sequence_bias={(a,): -1.1, (a, nxt[0]): -5.0},
                                  repetition_penalty=1.4),
        "bad_words": dict(bad_words_ids=[[a], [b], [a, nxt[0]], [nxt[0], nxt[1], 5]]),
        "suppress": dict(suppress_tokens=[a, c, 3, 5000]),
        "begin_suppress": dict(begin_suppress_tokens=[c, b]),
        "min_new_tokens": dict(min_new_tokens=6, eos_token_id=a),
        "min_length": dict(min_length=12, eos_token_id=[a, b]),
        "combined_rp": dict(sequence_bias={(b,): 1.9, (c,): -0.4}, bad_words_ids=[[a], [7, 8]],
                            suppress_tokens=[nxt[1]], begin_suppress_tokens=[c],
                            min_new_tokens=4, eos_token_id=[b, 9], repetition_penalty=1.3,
                            no_repeat_ngram_size=3),
    }


CASES = ("seq_bias", "seq_bias_rp", "seq_bias_-inf", "seq_bias_multi_rp", "bad_words",
         "suppress", "begin_suppress", "min_new_tokens", "min_length", "combined_rp")


@pytest.mark.parametrize("case", CASES)
def test_greedy_token_identical_with_equal_scores(model, prompts, free, case):
    ids, mask = prompts
    kw = dict(_cases(free)[case], attention_mask=mask, max_new_tokens=10, do_sample=False,
              pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    kw.setdefault("eos_token_id", None)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores)
    for mine, theirs in zip(out.scores, ref.scores):
        assert torch.equal(torch.isinf(mine), torch.isinf(theirs))
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_each_case_changes_the_output(model, prompts, free):
    """The cases are not vacuous: each argument changes transformers' greedy tokens."""
    ids, mask = prompts
    for case, args in _cases(free).items():
        kw = dict(args, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
        kw.setdefault("eos_token_id", None)
        base = model.generate(ids, **{k: v for k, v in kw.items()
                                      if k in ("attention_mask", "max_new_tokens", "do_sample",
                                               "pad_token_id", "eos_token_id")})
        assert not torch.equal(model.generate(ids, **kw), base), case


def _hf_chain(model, kw, ids, mask):
    """transformers' processor list for `kw` (the chain model.generate builds)."""
    gc = GenerationConfig(**{k: v for k, v in kw.items() if k != "attention_mask"})
    model._prepare_special_tokens(gc, True, device=ids.device)
    return model._get_logits_processor(
        generation_config=gc, input_ids_seq_length=ids.shape[1], encoder_input_ids=ids,
        logits_processor=lp.LogitsProcessorList(), device=ids.device,
        model_kwargs={"attention_mask": mask})


def test_sampling_scores_are_transformers_chain_every_step(model, prompts, free):
    """Under sampling, every step's processed scores are transformers' chain applied to the
    same raw logits and history (the distribution drawn from), and each token lies in it
    (a row that has drawn an eos token is padded from the next step on, as in transformers)."""
    ids, mask = prompts
    kw = dict(_cases(free)["combined_rp"], attention_mask=mask, max_new_tokens=8,
              do_sample=True, temperature=0.8, top_k=40, top_p=0.9, pad_token_id=0,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    out = generate(model, ids, seed=5, **kw)
    chain, L = _hf_chain(model, kw, ids, mask), ids.shape[1]
    live = torch.ones(ids.shape[0], dtype=torch.bool)
    for i, (scores, logits) in enumerate(zip(out.scores, out.logits)):
        expect = chain(out.sequences[:, :L + i], logits.clone())
        torch.testing.assert_close(scores, expect, atol=1e-5, rtol=0)
        tok = out.sequences[:, L + i]
        assert bool(torch.isfinite(scores.gather(1, tok[:, None]))[live].all())
        live &= ~torch.isin(tok, torch.tensor(kw["eos_token_id"]))


def _spy(monkeypatch):
    """Record sample()'s keyword arguments and the transformers processors that run."""
    seen, ran = [], []
    real = gpu_sampler.hf.generation.sample
    monkeypatch.setattr(gpu_sampler.hf.generation, "sample",
                        lambda *a, **k: seen.append(k) or real(*a, **k))

    def spied(call):
        def __call__(self, input_ids, scores):  # LogitsProcessorList reads this signature
            ran.append(type(self).__name__)
            return call(self, input_ids, scores)
        return __call__

    for cls in (lp.SequenceBiasLogitsProcessor, lp.NoBadWordsLogitsProcessor,
                lp.SuppressTokensLogitsProcessor, lp.SuppressTokensAtBeginLogitsProcessor,
                lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor,
                lp.RepetitionPenaltyLogitsProcessor):
        monkeypatch.setattr(cls, "__call__", spied(cls.__call__))
    return seen, ran


def _bias(k):
    ids, vals = k["logit_bias"]
    return {(int(i), float(v)) for i, v in zip(ids[0].tolist(), vals[0].tolist())}


def test_mapping_is_used_instead_of_torch(monkeypatch, model, prompts):
    ids, mask = prompts
    seen, ran = _spy(monkeypatch)
    generate(model, ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
             sequence_bias={(40,): 1.5, (41,): -2.0}, bad_words_ids=[[42], [2]],
             suppress_tokens=[43], begin_suppress_tokens=[44], min_new_tokens=3,
             eos_token_id=[2, 45], repetition_penalty=1.3,
             pad_token_id=0)
    assert ran == []                            # no transformers processor ran in torch
    assert all(k["repetition_penalty"] == 1.3 for k in seen)  # the penalty stays fused
    inf = float("-inf")
    static = {(40, 1.5), (41, -2.0), (42, inf), (43, inf)}  # [2] is eos: transformers drops it
    eos = {(2, inf), (45, inf)}  # steps 0-2 (min_new_tokens also sets transformers' min_length)
    assert [_bias(k) for k in seen] == [static | eos | {(44, inf)}, static | eos, static | eos,
                                        static, static]


@pytest.mark.parametrize("args,torch_side", [
    (dict(sequence_bias={(40,): 1.5, (40, 41): -2.0}, repetition_penalty=1.3),
     ["SequenceBiasLogitsProcessor", "RepetitionPenaltyLogitsProcessor"]),
    (dict(sequence_bias={(40,): float("inf")}, suppress_tokens=[40]),
     ["SequenceBiasLogitsProcessor", "SuppressTokensLogitsProcessor"]),
    (dict(bad_words_ids=[[42], [40, 41]], repetition_penalty=1.3),
     ["NoBadWordsLogitsProcessor"]),
    (dict(suppress_tokens=[43], remove_invalid_values=True),
     ["SuppressTokensLogitsProcessor"]),
], ids=["multi-token-bias", "+inf-bias", "long-bad-word", "impure-chain"])
def test_what_stays_in_torch(monkeypatch, model, prompts, args, torch_side):
    """Multi-token biases (and the penalty after them), +inf biases, longer bad words and any
    chain holding a processor that is neither a mask nor the penalty keep transformers'
    processors; the tokens stay transformers'."""
    ids, mask = prompts
    kw = dict(args, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    ref = model.generate(ids, **kw)
    seen, ran = _spy(monkeypatch)
    out = generate(model, ids, **kw)
    assert torch.equal(out, ref)
    assert sorted(set(ran)) == sorted(torch_side)
    if "NoBadWordsLogitsProcessor" in torch_side and "sequence_bias" not in args:
        # only the 2-token word stays in torch; the 1-token one is sample()'s logit_bias
        assert all(_bias(k) == {(42, float("-inf"))} for k in seen)
    else:
        assert all("logit_bias" not in k for k in seen)


def test_bias_id_beyond_vocabulary_raises_like_transformers(model, prompts):
    ids, mask = prompts
    kw = dict(attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0,
              sequence_bias={(V + 3,): 1.0})
    with pytest.raises(ValueError, match="vocabulary size"):
        model.generate(ids, **kw)
    with pytest.raises(ValueError, match=f"vocabulary size is {V}.*{V + 3}"):
        generate(model, ids, **kw)


def test_seq2seq_greedy_token_identical():
    model = tiny_seq2seq("bart", seed=3)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 120, (2, 6), generator=g)
    kw = dict(max_new_tokens=8, do_sample=False, sequence_bias={(7,): 2.5, (9,): -1.5},
              bad_words_ids=[[11]], suppress_tokens=[12], min_new_tokens=3,
              repetition_penalty=1.5, return_dict_in_generate=True, output_scores=True)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    for mine, theirs in zip(out.scores, ref.scores):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_sample_logit_bias_semantics_the_mapping_relies_on():
    """Duplicates add (finite + -inf = -inf), the bias acts before the repetition penalty,
    a -inf bias survives the penalty; on the torch backend."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 50, generator=g)
    hist = torch.tensor([[3, 4, 5], [6, 7, -1]])
    ids = torch.tensor([[3, 3, 9, 4], [6, 6, 8, -1]])
    vals = torch.tensor([[1.25, float("-inf"), 0.5, -0.75], [2.0, 0.5, -3.0, 9.0]])
    rp = 1.7
    expect = x.clone()
    expect[0, 3], expect[0, 9], expect[0, 4] = float("-inf"), x[0, 9] + 0.5, x[0, 4] - 0.75
    expect[1, 6], expect[1, 8] = x[1, 6] + 2.0 + 0.5, x[1, 8] - 3.0
    expect = _penalised(expect, hist, rp)
    got = gpu_sampler.sampling_distribution(x, logit_bias=(ids, vals), repetition_penalty=rp,
                                            input_ids=hist, backend="torch")
    torch.testing.assert_close(got, torch.softmax(expect, 1), atol=1e-6, rtol=0)
    assert got[0, 3] == 0
    tok = gpu_sampler.sample(x, logit_bias=(ids, vals), repetition_penalty=rp, input_ids=hist,
                             temperature=0.0, backend="torch")
    assert torch.equal(tok, expect.argmax(1))


def _penalised(x, hist, rp):
    """transformers' repetition penalty on the ids of `hist` (negative ids are padding)."""
    out = x.clone()
    for r in range(x.shape[0]):
        for t in set(i for i in hist[r].tolist() if i >= 0):
            out[r, t] = x[r, t] * rp if x[r, t] < 0 else x[r, t] / rp
    return out
