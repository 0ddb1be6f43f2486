"""Beam search / beam sampling against transformers' model.generate, and the fused beam step."""
import numpy as np
import pytest
import torch
from scipy import stats
from torch.nn import functional as F
from transformers.generation import logits_process as lp

import gpu_sampler.params
from gpu_sampler.beam import beam_topk, beam_topk_reference
from gpu_sampler.hf.cache import StaticKVCache
from gpu_sampler.hf.common import Unsupported
from gpu_sampler.hf.generation import generate
from tests.conftest import BACKENDS
from tests.models import Recorder, left_padded, tiny_model
from tests.test_generate import _BanMultiplesOf, _seed

V = 1000


# ---- the beam step ----------------------------------------------------------------------------

def _step_inputs(kind, N, Vs, g):
    x = torch.randn(N, Vs, generator=g) * 3
    kw = {}
    if kind == "ties":
        x = torch.randint(-3, 3, (N, Vs), generator=g).float()
    if kind in ("rep", "ties"):
        kw = dict(repetition_penalty=1.6, input_ids=torch.randint(-1, Vs, (N, 9), generator=g))
    if kind == "temp_noise":
        kw = dict(temperature=0.7, seed=torch.randint(0, 2**62, (N,), generator=g), offset=11)
    if kind == "inf_heavy":  # rows with fewer finite candidates than k
        c = x.clone()
        c[torch.rand(N, Vs, generator=g) < 0.9] = float("-inf")
        kw = dict(candidates=c)
    if kind == "processed":  # already processed log-probs, with a mask on top
        c = x.clone()
        c[torch.rand(N, Vs, generator=g) < 0.3] = float("-inf")
        kw = dict(normalize=False, candidates=c)
    return x, kw


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs triton (GPU or interpreter)")
@pytest.mark.parametrize("kind", ["plain", "rep", "ties", "temp_noise", "inf_heavy", "processed"])
def test_kernel_matches_twin(kind):
    g = torch.Generator().manual_seed(hash(kind) % 1000)
    N, Vs, k = 3, 61, 6  # odd V; tile 16 on the interpreter exercises the tile loop
    x, kw = _step_inputs(kind, N, Vs, g)
    ref = beam_topk(x, k, backend="torch", **kw)
    from gpu_sampler import kernels
    out = kernels.beam_topk(x, k, tile=16, **kw)
    assert torch.equal(out[2], ref[2])
    for a, b in zip(out[:2], ref[:2]):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=0)


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs triton (GPU or interpreter)")
@pytest.mark.parametrize("kw", [{}, {"seed": torch.tensor([1, 2, 3, 4])},
                                {"repetition_penalty": 1.3,
                                 "input_ids": torch.tensor([[1], [3], [2], [0]])}])
def test_rows_with_nan_or_inf_are_nan_on_both_backends(kw):
    """log_softmax of a row holding NaN or +inf is NaN throughout (transformers' values): NaN
    values and keys, ids 0 .. k - 1, on both backends. The kernel dropped a NaN (max ignores
    it) and gave a finite log-softmax of the rest; a +inf row gave id 0 k times at -inf."""
    x = torch.randn(4, 61, generator=torch.Generator().manual_seed(3))
    x[0, 7] = float("inf")
    x[1, 40] = float("nan")
    x[3, 60] = float("nan")
    x[3, 2] = float("inf")
    from gpu_sampler import kernels
    for out in (kernels.beam_topk(x, 5, tile=16, **kw), beam_topk_reference(x, 5, **kw)):
        for t in out[:2]:
            assert bool(t[[0, 1, 3]].isnan().all()) and not bool(t[2].isnan().any())
        assert out[2][[0, 1, 3]].tolist() == [list(range(5))] * 3
    ref = beam_topk_reference(x[2:3], 5, **{a: (b[2:3] if isinstance(b, torch.Tensor) else b)
                                            for a, b in kw.items()})
    got = kernels.beam_topk(x, 5, tile=16, **kw)
    assert torch.equal(got[2][2:3], ref[2])


@pytest.mark.parametrize("kind", ["plain", "rep", "ties", "inf_heavy"])
def test_twin_is_transformers_log_probs_topk(kind):
    """Values are log_softmax -> RepetitionPenaltyLogitsProcessor -> -inf masks (transformers'
    beam-search order); ids are the top k, ties broken by the lower id."""
    g = torch.Generator().manual_seed(7)
    x, kw = _step_inputs(kind, 4, 301, g)
    k = 8
    v, key, ids = beam_topk_reference(x, k, **kw)
    full = F.log_softmax(x, dim=-1)
    if "input_ids" in kw:
        pen = lp.RepetitionPenaltyLogitsProcessor(kw["repetition_penalty"])
        hist = kw["input_ids"]  # -1 is padding, not history
        full = torch.cat([pen(hist[b][hist[b] >= 0][None], full[b:b + 1]) for b in range(4)])
    if "candidates" in kw:
        full = full.masked_fill(kw["candidates"] == float("-inf"), float("-inf"))
    torch.testing.assert_close(v, full.gather(1, ids), atol=1e-6, rtol=0)
    assert torch.equal(v, key)
    for b in range(4):
        order = sorted(range(301), key=lambda i: (-float(full[b, i]), i))[:k]
        assert ids[b].tolist() == order


# ---- beam search against transformers -----------------------------------------------------------

@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2"])
def arch_model(request):
    return tiny_model(request.param, seed=5)


BEAM_CASES = {
    "neg_length_penalty_nrs": dict(length_penalty=-0.7, num_return_sequences=3),
    "rep_ngram_badwords": dict(repetition_penalty=1.3, no_repeat_ngram_size=2,
                               bad_words_ids=[[7], [11, 12]]),
    "min_new_eos_list": dict(min_new_tokens=3, eos_token_id=[2, 5, 9]),
    "early_true": dict(early_stopping=True, length_penalty=0.5),
    "never_lp2": dict(early_stopping="never", length_penalty=2.0),
}


def _rows_match(a, b):
    return bool(torch.equal(torch.isinf(a), torch.isinf(b))
                and torch.allclose(a.nan_to_num(0, 0, 0), b.nan_to_num(0, 0, 0), atol=1e-5, rtol=0))


def _assert_same_step_rows(a, b):
    """One step's (rows, V) scores or logits equal row for row or, where running beams tie
    (transformers' torch.topk and our stable order may put tied beams in other slots; the
    sequences, beam_indices and sequences_scores are still compared exactly), equal up to a
    permutation of the rows."""
    assert a.shape == b.shape
    if all(_rows_match(x, y) for x, y in zip(a, b)):
        return
    left = list(range(b.shape[0]))
    for i, x in enumerate(a):
        hit = next((j for j in left if _rows_match(x, b[j])), None)
        assert hit is not None, f"row {i}: no transformers row has our row's values"
        left.remove(hit)


def test_step_rows_compare_up_to_a_permutation_only():
    g = torch.Generator().manual_seed(_seed())
    a = torch.randn(6, 50, generator=g)
    a[:, 7] = float("-inf")
    _assert_same_step_rows(a, a[[2, 0, 1, 3, 5, 4]])  # tied beams in other slots
    off = a.clone()
    off[3, 11] += 1e-3  # one value off
    for bad in (off, a[[0, 0, 1, 2, 3, 4]]):  # ... or one beam twice, another missing
        with pytest.raises(AssertionError):
            _assert_same_step_rows(bad, a)
    b = a.clone()
    b[1, 7] = 0.0  # a masked entry unmasked
    with pytest.raises(AssertionError):
        _assert_same_step_rows(b, a)


def _assert_same_output(out, ref):
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores, atol=1e-4, rtol=1e-5)
    assert torch.equal(out.beam_indices, ref.beam_indices)
    assert len(out.scores) == len(ref.scores) and len(out.logits) == len(ref.logits)
    for a, b in zip(out.scores + out.logits, ref.scores + ref.logits):
        _assert_same_step_rows(a, b)


@pytest.mark.parametrize("case", list(BEAM_CASES))
def test_beam_search_matches_hf(arch_model, case):
    ids, mask = left_padded([9, 5, 2], _seed())
    kw = dict(BEAM_CASES[case], num_beams=3, max_new_tokens=6, do_sample=False,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    ref = arch_model.generate(ids, attention_mask=mask, **kw)
    out = generate(arch_model, ids, attention_mask=mask, **kw)
    _assert_same_output(out, ref)
    plain = generate(arch_model, ids, attention_mask=mask, **dict(
        kw, return_dict_in_generate=False))
    assert torch.equal(plain, ref.sequences)


@pytest.mark.parametrize("extra", ["token_type_ids", "position_ids"])
def test_beam_search_forwards_model_inputs_like_hf(extra):
    # Every model input that greedy forwards must reach the model under beam search too:
    # a dropped one gives other tokens, silently.
    model = tiny_model("gpt2", seed=5)
    ids, mask = left_padded([7, 4], _seed())
    g = torch.Generator().manual_seed(_seed())
    kw = dict(attention_mask=mask, num_beams=2, max_new_tokens=6, do_sample=False,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    if extra == "token_type_ids":
        kw["token_type_ids"] = torch.randint(0, 3, ids.shape, generator=g)
    else:
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0) + 7
    ref = model.generate(ids, **kw)
    _assert_same_output(generate(model, ids, **kw), ref)
    plain = model.generate(ids, **{k: v for k, v in kw.items() if k != extra})
    assert not torch.equal(plain.sequences, ref.sequences)  # the input matters here


def test_eos_met_early_finishes_like_hf():
    """eos ids taken from the beams themselves, so hypotheses finish mid-way (shorter rows padded
    with transformers' fill value)."""
    model = tiny_model("llama", seed=9)
    ids, mask = left_padded([4, 7], _seed())
    L = ids.shape[1]
    free = model.generate(ids, attention_mask=mask, num_beams=4, max_new_tokens=10,
                          do_sample=False, eos_token_id=V + 5)
    eos = [int(free[0, L + 2]), int(free[1, L + 4])]
    for es in (True, False):
        kw = dict(num_beams=4, max_new_tokens=10, do_sample=False, eos_token_id=eos,
                  num_return_sequences=4, early_stopping=es, return_dict_in_generate=True,
                  output_scores=True)
        ref = model.generate(ids, attention_mask=mask, **kw)
        out = generate(model, ids, attention_mask=mask, **kw)
        assert torch.equal(out.sequences, ref.sequences)
        torch.testing.assert_close(out.sequences_scores, ref.sequences_scores, atol=1e-4,
                                   rtol=1e-5)
        assert torch.equal(out.beam_indices, ref.beam_indices)


def test_user_processor_runs_in_order_like_hf():
    model = tiny_model("qwen2", seed=2)
    ids, mask = left_padded([6, 3], _seed())
    kw = dict(num_beams=3, max_new_tokens=6, do_sample=False, repetition_penalty=1.2,
              return_dict_in_generate=True, output_scores=True)
    procs = lambda: lp.LogitsProcessorList([_BanMultiplesOf(3)])  # noqa: E731
    ref = model.generate(ids, attention_mask=mask, logits_processor=procs(), **kw)
    out = generate(model, ids, attention_mask=mask, logits_processor=procs(), **kw)
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores, atol=1e-4, rtol=1e-5)
    assert not bool((out.sequences[:, ids.shape[1]:] % 3 == 0).any())


def test_kernel_in_the_loop_matches_hf(monkeypatch):
    """The Triton step (interpreter on CPU) inside generate: same tokens as transformers."""
    if "triton" not in BACKENDS:
        pytest.skip("needs triton")
    monkeypatch.setattr(gpu_sampler.params, "pick_backend", lambda backend, logits: "triton")
    model = tiny_model("llama", seed=3, vocab_size=96)
    ids, mask = left_padded([5, 3], _seed(), vocab=96)
    kw = dict(num_beams=2, max_new_tokens=4, do_sample=False, repetition_penalty=1.4,
              no_repeat_ngram_size=2, return_dict_in_generate=True, output_scores=True)
    _assert_same_output_no_scores(generate(model, ids, attention_mask=mask, **kw),
                                  model.generate(ids, attention_mask=mask, **kw))


def _assert_same_output_no_scores(out, ref):
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores, atol=1e-4, rtol=1e-5)
    assert torch.equal(out.beam_indices, ref.beam_indices)


def test_num_beams_1_is_greedy_like_hf():
    model = tiny_model("gpt2", seed=4)
    ids, mask = left_padded([5, 2], _seed())
    kw = dict(num_beams=1, max_new_tokens=6, do_sample=False, length_penalty=-1.0)
    assert torch.equal(generate(model, ids, attention_mask=mask, **kw),
                       model.generate(ids, attention_mask=mask, **kw))


# ---- beam sampling ------------------------------------------------------------------------------

def _pooled_chi2(a, b):
    """Two-sample chi-square on token counts, pooling cells with few expected counts."""
    tot = a + b
    big = tot >= 10
    rows = np.stack([np.append(a[big], a[~big].sum()), np.append(b[big], b[~big].sum())])
    rows = rows[:, rows.sum(0) > 0]
    assert rows.shape[1] > 3, "too few distinct tokens for a meaningful test"
    return stats.chi2_contingency(rows)[1]


@pytest.mark.parametrize("config", [
    dict(top_k=12),                               # warpers on log-probs run in torch
    dict(top_k=None, temperature=3.0),            # fused temperature + Gumbel keys
])
def test_beam_sampling_first_step_matches_hf_in_distribution(config):
    model = tiny_model("llama", seed=8)
    ids, _ = left_padded([6], _seed())
    n = 1500
    batch = ids.repeat(n, 1)
    kw = dict(config, do_sample=True, num_beams=2, num_return_sequences=2, max_new_tokens=1,
              return_dict_in_generate=True, output_scores=True)
    torch.manual_seed(0)
    ref = model.generate(batch, **kw)
    torch.manual_seed(0)
    out = generate(model, batch, **kw)
    # The processed step-0 log-probs are transformers' (same support).
    torch.testing.assert_close(out.scores[0], ref.scores[0], atol=1e-5, rtol=0)
    support = torch.isfinite(ref.scores[0][0])
    for r in range(2):  # best and second-best returned beam
        a = torch.bincount(out.sequences[r::2, -1], minlength=V)
        b = torch.bincount(ref.sequences[r::2, -1], minlength=V)
        assert int(a[~support].sum()) == 0
        p = _pooled_chi2(a.numpy(), b.numpy())
        assert p > 1e-4, (r, p)
    # sequences_scores are the drawn tokens' accumulated log-probs (length penalty 1).
    step = out.scores[0].view(n, 2, V)[:, 0]
    expect = step.gather(1, out.sequences[:, -1].view(n, 2)).flatten()
    torch.testing.assert_close(out.sequences_scores, expect, atol=1e-5, rtol=0)


def test_beam_sampling_seed_reproducible():
    model = tiny_model("gpt2", seed=3)
    ids, mask = left_padded([5, 3], _seed())
    kw = dict(do_sample=True, num_beams=3, max_new_tokens=5, seed=4)
    a = generate(model, ids, attention_mask=mask, **kw)
    assert torch.equal(a, generate(model, ids, attention_mask=mask, **kw))


# ---- cache, streamer, errors --------------------------------------------------------------------

def test_static_cache_reorders_in_place_in_hf_generate():
    model = tiny_model("llama", seed=11)
    ids, mask = left_padded([6, 4], _seed())
    kw = dict(num_beams=3, max_new_tokens=6, do_sample=False)
    ref = model.generate(ids, attention_mask=mask, **kw)
    cache = StaticKVCache(model.config, max_batch_size=6, max_cache_len=ids.shape[1] + 6)
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, **kw)
    assert torch.equal(out, ref)
    layer = cache.layers[0]
    ptr = layer.keys.data_ptr()
    before = layer.keys[:6, :, :layer.cumulative_length].clone()
    perm = torch.tensor([2, 2, 0, 5, 4, 1])
    cache.reorder_cache(perm)
    assert layer.keys.data_ptr() == ptr
    assert torch.equal(layer.keys[:6, :, :layer.cumulative_length], before[perm])


def test_generate_beam_cache_written_in_place(monkeypatch):
    model = tiny_model("llama", seed=16)
    seen = []
    real_update = StaticKVCache.update

    def update(self, k, v, layer_idx, *a, **kw):
        K, Vv = real_update(self, k, v, layer_idx, *a, **kw)
        if layer_idx == 0:
            seen.append((K.data_ptr(), K.shape))
        return K, Vv

    monkeypatch.setattr(StaticKVCache, "update", update)
    ids, mask = left_padded([5, 2], _seed())
    res = generate(model, ids, attention_mask=mask, num_beams=4, max_new_tokens=6,
                   do_sample=False, return_dict_in_generate=True)
    assert len(seen) == 6 and len({p for p, _ in seen}) == 1 and len({s for _, s in seen}) == 1
    # Returned as transformers returns it: a DynamicCache holding the running beams, reordered
    # after the last step too.
    monkeypatch.setattr(StaticKVCache, "update", real_update)
    ref = model.generate(ids, attention_mask=mask, num_beams=4, max_new_tokens=6,
                         do_sample=False, return_dict_in_generate=True)
    assert type(res.past_key_values) is type(ref.past_key_values)
    assert res.past_key_values.get_seq_length() == ref.past_key_values.get_seq_length()
    for a, b in zip(res.past_key_values.layers, ref.past_key_values.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


def test_streamer_refused_for_beam_search_like_hf():
    model = tiny_model("llama")
    ids = torch.randint(3, V, (1, 5))
    msgs = []
    for fn in (model.generate, lambda *a, **k: generate(model, *a, **k)):
        with pytest.raises(ValueError, match="streamer") as e:
            fn(ids, num_beams=2, max_new_tokens=3, streamer=Recorder())
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    # Beam sampling: transformers accepts the streamer and only puts the expanded prompt.
    rec_hf, rec = Recorder(), Recorder()
    model.generate(ids, num_beams=2, do_sample=True, max_new_tokens=3, streamer=rec_hf)
    generate(model, ids, num_beams=2, do_sample=True, max_new_tokens=3, streamer=rec)
    assert len(rec.calls) == len(rec_hf.calls) == 1 and torch.equal(rec.calls[0], rec_hf.calls[0])


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences"),
    (dict(num_beams=2, early_stopping="sometimes"), "early_stopping"),
    (dict(num_beams=2, low_memory=True), "low_memory"),
])
def test_bad_beam_arguments_raise_like_hf(kwargs, match):
    model = tiny_model("llama")
    ids = torch.randint(3, V, (1, 5))
    with pytest.raises(ValueError, match=match) as ref:
        model.generate(ids, max_new_tokens=3, **kwargs)
    with pytest.raises(ValueError, match=match) as ours:
        generate(model, ids, max_new_tokens=3, **kwargs)
    assert str(ours.value) == str(ref.value)


def test_beam_topk_bad_arguments():
    x = torch.randn(2, 10)
    for kw, match in ((dict(k=0), "k"), (dict(k=11), "k"), (dict(k=2, temperature=0.0),
                                                             "temperature"),
                      (dict(k=2, repetition_penalty=-1.0), "repetition_penalty"),
                      (dict(k=2, candidates=torch.randn(2, 9)), "candidates")):
        with pytest.raises(ValueError, match=match):
            beam_topk(x, **kw)
    with pytest.raises(ValueError, match="logits"):
        beam_topk(x.double(), 2)


@pytest.mark.slow
def test_beam_kernel_compiles_for_sm90():
    """The real Triton pipeline (not the interpreter) accepts the kernel, every flag on."""
    import os
    import subprocess
    import sys
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from gpu_sampler.kernels.beam import compile_beam_step as c; "
            "print(len(c().asm['cubin']), len(c(HAS_REP=False, HAS_CAND=False).asm['cubin']))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(int(n) > 0 for n in r.stdout.split())


def _same_tuples(ours, ref, what):
    assert isinstance(ours, tuple) and len(ours) == len(ref), what
    for i, (a, b) in enumerate(zip(ours, ref)):
        if isinstance(b, tuple):
            _same_tuples(a, b, f"{what}[{i}]")
        else:
            assert a.shape == b.shape, (what, i, a.shape, b.shape)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"{what}[{i}]")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_beam_search_returns_attentions_and_hidden_states_like_hf(arch):
    # Per model call, as the model gave them (not beam-reordered), over the written positions
    # only (transformers runs beam search on a DynamicCache): left padding included.
    model = tiny_model(arch, seed=6)
    model.set_attn_implementation("eager")
    ids, mask = left_padded([7, 3], _seed())
    kw = dict(attention_mask=mask, num_beams=3, num_return_sequences=2, max_new_tokens=5,
              do_sample=False, return_dict_in_generate=True, output_scores=True,
              output_attentions=True, output_hidden_states=True)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert torch.equal(out.beam_indices, ref.beam_indices)
    _same_tuples(out.attentions, ref.attentions, "attentions")
    _same_tuples(out.hidden_states, ref.hidden_states, "hidden_states")
    assert len(out.attentions) == len(out.scores)  # one model call per step


@pytest.mark.parametrize("case", ["plain", "penalty+attentions"])
def test_beam_search_from_inputs_embeds_like_hf(case):
    # The prefill reads the embeddings (P positions, left padded), the returned sequences hold
    # the new tokens only, and the penalty history starts empty, as in transformers.
    model = tiny_model("llama", seed=7)
    model.set_attn_implementation("eager")
    ids, mask = left_padded([6, 4], _seed())
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    kw = dict(attention_mask=mask, num_beams=3, max_new_tokens=5, do_sample=False,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    if case != "plain":
        kw.update(repetition_penalty=1.5, output_attentions=True)
    ref = model.generate(inputs_embeds=embeds, **kw)
    out = generate(model, inputs_embeds=embeds, **kw)
    _assert_same_output(out, ref)
    assert out.sequences.shape[1] <= 5  # new tokens only
    if case != "plain":
        _same_tuples(out.attentions, ref.attentions, "attentions")


@pytest.mark.parametrize("arch,extra", [("llama", "sampling"), ("gpt2", "token_type_ids")])
def test_beam_search_without_cache_like_hf(arch, extra):
    # use_cache=False: transformers feeds the whole sequence (mask, positions, token types)
    # every step, so each step's attentions / hidden states span it and no cache comes back.
    model = tiny_model(arch, seed=8)
    model.set_attn_implementation("eager")
    ids, mask = left_padded([7, 3], _seed())
    kw = dict(attention_mask=mask, num_beams=3, num_return_sequences=2, max_new_tokens=5,
              do_sample=False, use_cache=False, return_dict_in_generate=True,
              output_scores=True, output_logits=True, output_attentions=True,
              output_hidden_states=True)
    if extra == "token_type_ids":
        g = torch.Generator().manual_seed(_seed())
        kw["token_type_ids"] = torch.randint(0, 3, ids.shape, generator=g)
    ref = model.generate(ids, **kw)
    out = generate(model, ids, **kw)
    _assert_same_output(out, ref)
    _same_tuples(out.attentions, ref.attentions, "attentions")
    _same_tuples(out.hidden_states, ref.hidden_states, "hidden_states")
    assert out.past_key_values is None and ref.past_key_values is None
    assert out.attentions[-1][0].shape[-1] == out.sequences.shape[1] - 1  # the whole sequence
    if extra == "sampling":  # beam sampling draws the same tokens with and without a cache
        kw = dict(attention_mask=mask, num_beams=2, max_new_tokens=6, do_sample=True,
                  temperature=0.8, seed=3)
        assert torch.equal(generate(model, ids, use_cache=False, **kw),
                           generate(model, ids, **kw))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_beam_search_continues_a_passed_cache_like_hf(arch):
    # transformers runs beams on a passed cache only when the caller expanded it to
    # B * num_beams rows: the prefill feeds what it lacks, the loop reorders it in place and
    # returns the same object. A cache of B rows fails in transformers: refused here (patch
    # hands the call over and the user gets transformers' own error).
    model = tiny_model(arch, seed=9)
    ids, mask = left_padded([7, 4], _seed())
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                           return_dict_in_generate=True)
    full = first.sequences
    full_mask = torch.cat([mask, mask.new_ones(2, 3)], dim=1)
    kw = dict(attention_mask=full_mask, num_beams=2, max_new_tokens=4, do_sample=False,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    caches = []
    for _ in range(2):
        c = first.past_key_values.__class__(config=model.config)
        for i, layer in enumerate(first.past_key_values.layers):
            c.update(layer.keys.clone(), layer.values.clone(), i)
        c.batch_repeat_interleave(2)
        caches.append(c)
    ref = model.generate(full, past_key_values=caches[0], **kw)
    out = generate(model, full, past_key_values=caches[1], **kw)
    _assert_same_output(out, ref)
    assert out.past_key_values is caches[1]
    assert caches[1].get_seq_length() == caches[0].get_seq_length()
    for a, b in zip(caches[1].layers, caches[0].layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
    with pytest.raises(Unsupported, match="past_key_values"):
        generate(model, full, past_key_values=first.past_key_values, **kw)


@pytest.mark.parametrize("return_dict", [False, True])
def test_beam_search_on_sliding_window_layers_like_hf(return_dict):
    # Our cache keeps a sliding layer's window (not every position): the sequences come from
    # it, and a returned cache is transformers' DynamicCache (the loop then runs on one).
    model = tiny_model("mistral", seed=12, sliding_window=4)
    ids, mask = left_padded([6, 3], _seed())
    kw = dict(attention_mask=mask, num_beams=2, max_new_tokens=5, do_sample=False,
              return_dict_in_generate=return_dict)
    ref, out = model.generate(ids, **kw), generate(model, ids, **kw)
    if not return_dict:
        assert torch.equal(out, ref)
        return
    assert torch.equal(out.sequences, ref.sequences)
    assert type(out.past_key_values) is type(ref.past_key_values)
    for a, b in zip(out.past_key_values.layers, ref.past_key_values.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)


def test_beam_search_from_embeds_on_a_passed_cache_like_hf():
    # inputs_embeds span the cached positions too: the prefill feeds only what the cache lacks.
    model = tiny_model("llama", seed=9)
    ids, mask = left_padded([7, 4], _seed())
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                           return_dict_in_generate=True)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(first.sequences)

    def expanded():
        cache = first.past_key_values.__class__(config=model.config)
        for i, layer in enumerate(first.past_key_values.layers):
            cache.update(layer.keys.clone(), layer.values.clone(), i)
        cache.batch_repeat_interleave(2)
        return cache
    kw = dict(attention_mask=torch.cat([mask, mask.new_ones(2, 3)], dim=1), num_beams=2,
              max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
              output_scores=True, output_logits=True)
    ref = model.generate(inputs_embeds=embeds, past_key_values=expanded(), **kw)
    _assert_same_output(generate(model, inputs_embeds=embeds, past_key_values=expanded(), **kw),
                        ref)


@pytest.mark.parametrize("kw", [dict(num_beams=5), dict(num_beams=3, eos_token_id=[4, 5, 6]),
                                dict(num_beams=5, do_sample=True)],
                         ids=["beams-over-vocab", "eos-list-over-vocab", "sampling"])
def test_more_candidates_than_vocab_runs_like_hf(kw):
    """K = max(2, 1 + n_eos) * num_beams may exceed V: transformers picks K among an item's
    nb * V continuations, so a row gives at most V (beam_topk refused k > V)."""
    model = tiny_model("llama", seed=5, vocab_size=8)
    ids, mask = left_padded([4, 2], _seed(), vocab=8)
    call = dict(dict(do_sample=False, eos_token_id=None), max_new_tokens=3, **kw)
    if call["do_sample"]:  # draws differ: the same structure
        torch.manual_seed(0)
        ref = model.generate(ids, attention_mask=mask, num_return_sequences=5, **call)
        out = generate(model, ids, attention_mask=mask, num_return_sequences=5, **call)
        assert out.shape == ref.shape
        return
    ref = model.generate(ids, attention_mask=mask, return_dict_in_generate=True,
                         output_scores=True, **call)
    out = generate(model, ids, attention_mask=mask, return_dict_in_generate=True,
                   output_scores=True, **call)
    _assert_same_output_no_scores(out, ref)


@pytest.mark.parametrize("num_beams,new", [(2, 1), (3, 4), (4, 5)])
def test_exact_ties_are_broken_like_torch_topk(num_beams, new):
    """Equal accumulated log-probs (here: zero lm_head rows, equal logits) are ordered by
    transformers' torch.topk over the item's nb * V scores, not by the lowest index."""
    model = tiny_model("llama", seed=6, vocab_size=96)
    with torch.no_grad():
        model.lm_head.weight[3:] = 0  # tokens 3..95: logit 0, tied
    ids, mask = left_padded([4, 2], _seed(), vocab=96)
    kw = dict(num_beams=num_beams, num_return_sequences=num_beams, max_new_tokens=new,
              do_sample=False, return_dict_in_generate=True, output_scores=True)
    ref = model.generate(ids, attention_mask=mask, **kw)
    _assert_same_output_no_scores(generate(model, ids, attention_mask=mask, **kw), ref)


class _BanPerCall(lp.LogitsProcessor):
    """Stateful: bans a different token on every call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        return scores.index_fill(1, torch.tensor([3 + self.calls]), float("-inf"))


@pytest.mark.parametrize("do_sample", [False, True])
def test_user_processors_run_once_a_step_like_hf(do_sample):
    """transformers runs the processor chain once a step; recording the scores must not run
    it a second time (a stateful processor then saw two calls a step)."""
    model = tiny_model("llama", seed=1, vocab_size=64)
    ids, mask = left_padded([5, 3], _seed(), vocab=64)
    kw = dict(num_beams=3, max_new_tokens=5, do_sample=do_sample, seed=0 if do_sample else None,
              return_dict_in_generate=True, output_scores=True)
    mine, theirs = _BanPerCall(), _BanPerCall()
    out = generate(model, ids, attention_mask=mask, logits_processor=[mine], **kw)
    kw.pop("seed")
    ref = model.generate(ids, attention_mask=mask, logits_processor=[theirs], **kw)
    assert mine.calls == theirs.calls == len(ref.scores)
    if not do_sample:
        _assert_same_output_no_scores(out, ref)
        for a, b in zip(out.scores, ref.scores):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
