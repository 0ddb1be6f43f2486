"""Top-N logprobs from the kernels' one read (kernels/topn.py), under the interpreter: the same
ids as the torch twin's rule (gpu_sampler/reference.py twin_top_n_raw / twin_top_n_processed),
logprobs within rounding, the drawn token's entry its own logprob bit for bit, the same result
for any chunk count, and the logits still read once. Small tiles (64 tokens) give many blocks
at a low interpreter cost (tl.topk is a bitonic network of a few hundred numpy ops a block)."""
import pytest
import torch

from conftest import BACKENDS, DEVICE
from gpu_sampler import pack_mask, reference
from gpu_sampler.params import SamplingParams
from test_kernel_v2 import LogitReads, _run

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

V = 517   # 9 blocks of 64, the last one short
PARAMS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty")


def _rows(B, g, dtype=torch.float32):
    """Gaussian, tie-heavy, -inf-heavy and flat rows, in turn."""
    x = torch.randn(B, V, generator=g) * 3
    x[1::4] = torch.randint(-3, 3, x[1::4].shape, generator=g).float()
    x[2::4, 5:510] = float("-inf")   # 12 finite logits
    x[3::4] = torch.randn(x[3::4].shape, generator=g) * 0.3
    return x.to(dtype)


def _same(got, want, exact_ids=True):
    ids, lp = got
    wids, wlp = want
    assert torch.equal(ids, wids)
    torch.testing.assert_close(lp, wlp, atol=2e-5, rtol=1e-5, equal_nan=True)


def _twin_processed(x, n, kw):
    p = SamplingParams(**{k: kw[k] for k in PARAMS if k in kw} | {
        k: d for k, d in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0),
                          ("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                          ("frequency_penalty", 0.0)) if k not in kw})
    return reference.twin_top_n_processed(x, p, n, kw.get("input_ids"), kw.get("prompt_lens"))


def _edits(B, g):
    """A request's mask and bias as the public layer hands them to the kernel: (the kernel's
    keyword arguments, the LogitEdits the twin applies)."""
    from gpu_sampler import edits
    allowed = torch.rand(B, V, generator=g) < 0.5
    allowed[:, 0] = True
    allowed[:, 100:104] = True
    bias = (torch.randint(0, V, (B, 6), generator=g), torch.randn(B, 6, generator=g) * 3)
    ed = edits.prepare_edits(torch.empty(B, V), pack_mask(allowed), bias, True)
    return dict(allowed_words=ed.words, logit_bias=(ed.bias_ids, ed.bias_values)), ed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_top_n_is_the_twin_rule_with_edits_and_one_read(dtype, monkeypatch):
    g = torch.Generator().manual_seed(1)
    x = _rows(4, g, dtype)
    x[3, 7] = float("nan")                      # a NaN row: (-1, NaN) everywhere
    reads = LogitReads(x, monkeypatch)
    # the mask, the bias and the penalties change what is sampled, never the raw logprobs
    tok, logp, ids, lp = _run(x, temperature=0.8, top_k=20, repetition_penalty=1.3,
                              input_ids=torch.randint(0, V, (4, 9), generator=g), seed=3,
                              top_n=20, tile=64, **_edits(4, g)[0])
    assert reads.bytes == x.numel() * x.element_size()   # the one read
    _same((ids, lp), reference.twin_top_n_raw(x, 20))
    assert ids[3].eq(-1).all() and lp[3].isnan().all()
    assert ids[2, 12:].eq(-1).all() and lp[2, 12:].eq(float("-inf")).all()  # 12 finite


MIXED = dict(temperature=torch.tensor([0.0, 1.0, 0.7, 1.2, 0.9, float("nan"), 1e-40, 0.6]),
             top_k=torch.tensor([0, 0, 30, 0, 0, 0, 0, 3]),
             top_p=torch.tensor([1.0, 1.0, 0.9, 0.95, 1.0, 1.0, 1.0, 1.0]),
             min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0]),
             repetition_penalty=1.2, presence_penalty=0.3, seed=torch.arange(8) + 5, offset=2)


@pytest.mark.parametrize("n", [1, 64])
def test_processed_top_n_per_row_mix(n):
    """Greedy, pure temperature, top-k + top-p, top-p alone, min-p alone, an invalid row, an
    overflowed row (T 1e-40: its xp argmax group, uniformly) and a small top-k, with penalties,
    a mask and a bias: the twin's ids, and the drawn token's entry is its logprob."""
    g = torch.Generator().manual_seed(2)
    x = _rows(8, g)
    x[6, 100:104] = 50.0                                  # the overflowed row's tie group
    kw = dict(MIXED, input_ids=torch.randint(0, V, (8, 14), generator=g))
    fused, ed = _edits(8, g)
    tok, logp, ids, lp = _run(x, top_n=n, top_n_raw=False, tile=64, **fused, **kw)
    from gpu_sampler import edits
    _same((ids, lp), _twin_processed(edits.apply_edits(x, ed), n, kw))
    hit = (ids == tok[:, None]) & (tok[:, None] >= 0)
    listed = hit.any(1)                 # the drawn token among the N best: its own logprob
    assert torch.equal(lp[hit], logp[listed]) and bool(listed[[0, 2, 7]].all())
    assert ids[5].eq(-1).all() and tok[5] == -1           # the invalid row
    assert ids[0, 0] == tok[0] and lp[0, 0] == 0.0        # the greedy row
    if n >= 4:
        assert ids[6, :4].tolist() == [100, 101, 102, 103]


def test_processed_top_n_on_the_second_read_and_the_row_pass_any_chunking():
    """Rows the candidates cannot finish (few slots per block): min-p alone takes the second
    read, top-p alone the merge's row pass (no band read with a row state); the same top-N for
    one program per row and for many."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, V, generator=g) * 0.5
    kw = dict(temperature=1.0, min_p=torch.tensor([0.3, 0.0, 0.2, 0.0]),
              top_p=torch.tensor([1.0, 0.9, 1.0, 0.5]), seed=7, offset=1)
    outs = [_run(x, top_n=20, top_n_raw=False, tile=64, cand=4, chunks=c, **kw)
            for c in (1, 9)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    _same(outs[0][2:], _twin_processed(x, 20, kw))


def test_top_n_wider_than_the_row():
    x = torch.randn(2, 5)
    for raw in (True, False):
        _, _, ids, lp = _run(x, temperature=0.5, top_n=64, top_n_raw=raw, seed=1)
        assert ids.shape == (2, 64) and ids[:, 5:].eq(-1).all() and lp[:, 5:].eq(float("-inf")).all()
        assert sorted(ids[0, :5].tolist()) == list(range(5))


def test_raw_top_n_of_tied_rows_takes_the_row_pass(monkeypatch):
    """A block with more tied logits at its max than it has candidate slots stores none: the
    candidates cannot prove the row's N best, and the row kernel reads the row once more
    (lowest ids first among the ties); a row they do prove costs no second read."""
    x = torch.zeros(2, 300)
    x[1] = torch.randn(300, generator=torch.Generator().manual_seed(6))
    reads = LogitReads(x, monkeypatch)
    # a penalty makes xp differ from the raw logits: the raw candidates are the top-N's own
    # (64 slots a block of 128); without one they are the sampling candidates (128 slots here)
    kw = dict(temperature=1.0, top_k=3, seed=1, top_n=5, tile=128)
    _, _, ids, lp = _run(x, repetition_penalty=1.1, input_ids=torch.tensor([[299]] * 2), **kw)
    _same((ids, lp), reference.twin_top_n_raw(x, 5))
    assert ids[0].tolist() == [0, 1, 2, 3, 4]
    assert reads.bytes == (x.numel() + 300) * 4      # the tied row read twice, the other once
    reads.bytes = 0
    _same(_run(x, **kw)[2:], reference.twin_top_n_raw(x, 5))
    assert reads.bytes == x.numel() * 4


def test_raw_top_n_on_the_sampling_candidates(monkeypatch):
    """No penalty, mask, bias or pure row: the raw logits are xp, and the raw top-N comes from
    the sampling candidates themselves (TOPN_REUSE). A row whose x overflows (T 1e-40) redid
    its blocks without some logits: the row pass; a greedy row; chunk counts agree."""
    g = torch.Generator().manual_seed(7)
    x = _rows(4, g)
    kw = dict(temperature=torch.tensor([0.7, 1e-40, 0.0, 1.0]), top_k=20, seed=2, top_n=20,
              tile=64)
    outs = [_run(x, chunks=c, **kw) for c in (1, 9)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    _same(outs[0][2:], reference.twin_top_n_raw(x, 20))


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_signed_zeros_tie_to_the_lower_id(mode):
    """-0.0 == +0.0: equal logits, the lower id first, as the twin (the order key ordered the
    bits, -0 before +0 wrongly: ids [1, 0] against the twin's [0, 1])."""
    from gpu_sampler import sample
    x = torch.tensor([[-0.0, 0.0, -1.0, -2.0], [-5.0, -0.0, 0.0, -0.0]])
    got = sample(x, top_logprobs=3, logprobs_mode=mode, seed=1, backend="triton")
    want = sample(x, top_logprobs=3, logprobs_mode=mode, seed=1, backend="torch")
    assert got.top_ids.tolist() == [[0, 1, 2], [1, 2, 3]]
    _same((got.top_ids, got.top_logprobs), (want.top_ids, want.top_logprobs))


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, min_p=0.0),
                                dict(temperature=1.0, top_p=1.0), dict(temperature=1.0, top_k=5)])
def test_processed_places_past_the_finite_tokens_are_minus_one(kw):
    """A row with fewer finite tokens than N: its -inf tokens are never kept (-1, -inf), as the
    twin. With no threshold (tau = -inf) and the min-p cut at -inf, they passed x >= tau and
    the cut, and came back with real ids and logprob -inf (found by fuzzing)."""
    from gpu_sampler import sample
    x = torch.full((2, 63), float("-inf"))
    x[0, 9] = 1.0
    x[1, [31, 32]] = torch.tensor([0.5, 0.2])
    got = sample(x, top_logprobs=3, logprobs_mode="processed", seed=1, backend="triton", **kw)
    want = sample(x, top_logprobs=3, logprobs_mode="processed", seed=1, backend="torch", **kw)
    assert got.top_ids.tolist() == [[9, -1, -1], [31, 32, -1]]
    _same((got.top_ids, got.top_logprobs), (want.top_ids, want.top_logprobs))


def test_raw_places_past_a_short_row_keep_the_nan_rule():
    """Raw top-N wider than the row: a row holding NaN or +inf has NaN places to the end, as
    the twin; the places past what the kernel selects came back -inf (the launch contrastive
    decoding with a mask or bias takes for its raw top-N)."""
    x = torch.randn(3, 7)
    x[0, 2], x[1, 4] = float("nan"), float("inf")
    _, _, ids, lp = _run(x, temperature=0.0, top_n=20, top_n_raw=True)
    assert lp[:2, 7:].isnan().all() and ids[:, 7:].eq(-1).all()
    _same((ids, lp), reference.twin_top_n_raw(x, 20))
