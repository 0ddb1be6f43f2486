"""Contrastive decoding fused into the sampler's launches (kernels/stats.py, kernels/merge.py).

The fused path must be the sampler run on ``contrastive_scores_reference``'s scores, bit for bit
(tokens, logprobs, distributions), including the rows where the stage-1 head (cut at each block's
own expert max) differs from the row's head: "dirty" blocks the merge re-reads and blocks it
empties. Interpreter sizes are small: 64-token blocks over V <= 1000.
"""
import pytest
import torch

import gpu_sampler
from conftest import BACKENDS, DEVICE
from gpu_sampler.contrastive import contrastive_scores_reference
from test_kernel_v2 import LogitReads

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

NAN, INF = float("nan"), float("inf")


def _ks():
    from gpu_sampler.kernels import sampling
    return sampling


def _pair(B, V, seed, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(B, V, generator=g) * spread
    a = e * 0.6 + torch.randn(B, V, generator=g)  # a correlated amateur, as in practice
    return e, a


def _on_scores(e, a, alpha, beta, **kw):
    """The reference: the same kernels on the materialised twin scores."""
    s = contrastive_scores_reference(e, a, alpha, beta)
    return _ks().fused_sample(s, **kw)


def _fused(e, a, alpha, beta, **kw):
    return _ks().fused_sample(e, amateur_logits=a, cd_alpha=alpha, cd_beta=beta, **kw)


CASES = [
    ("k-p", dict(temperature=0.7, top_k=20, top_p=0.9)),
    ("top-p", dict(top_p=0.8)),
    ("temperature-only", dict(temperature=1.1)),  # an unbounded row: the fallback with CD
    ("greedy", dict(temperature=0.0)),
    ("min-p+penalties", dict(min_p=0.05, repetition_penalty=1.3, presence_penalty=0.2)),
]


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_fused_equals_sampler_on_scores(name, kw):
    """Per-row alpha / beta (0, small, 1), 64-token blocks: many dirty and emptied blocks."""
    B, V = 4, 640
    e, a = _pair(B, V, len(name))
    alpha = torch.tensor([0.1, 0.0, 1e-3, 1.0])
    beta = torch.tensor([0.5, 1.0, 0.0, 0.3])
    if "penalties" in kw:
        kw = dict(kw, input_ids=torch.randint(0, V, (B, 30), generator=torch.Generator()
                                              .manual_seed(1)))
    draw = dict(seed=torch.arange(B) + 11, offset=3)
    want = _on_scores(e, a, alpha, beta, tile=64, **draw, **kw)
    got = _fused(e, a, alpha, beta, tile=64, chunks=3, **draw, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name
    if name != "greedy":  # temperature 0 is one-hot in both: nothing extra to compare
        p_want = _on_scores(e, a, alpha, beta, tile=64, write_probs=True, **kw)
        p_got = _fused(e, a, alpha, beta, tile=64, chunks=1, write_probs=True, **kw)
        assert torch.equal(p_got, p_want), name


def test_scalar_parameters_and_batch_invariance():
    e, a = _pair(3, 700, 5)
    kw = dict(temperature=0.8, top_k=40, seed=torch.tensor([1, 2, 3]), offset=9, tile=64)
    tok, lp = _fused(e, a, 0.1, 0.5, **kw)
    assert torch.equal(tok, _on_scores(e, a, 0.1, 0.5, **kw)[0])
    r = torch.tensor([2, 0])
    sub = dict(kw, seed=kw["seed"][r])
    tok2, lp2 = _fused(e[r], a[r], 0.1, 0.5, chunks=2, **sub)
    assert torch.equal(tok2, tok[r]) and torch.equal(lp2, lp[r])


def test_dirty_blocks_are_reread_and_others_are_not(monkeypatch):
    """Expert logits read once plus the dirty blocks; a block is dirty when its own head holds
    a token below the row's head. With one block near the max and the rest far below, every
    block is clean (emptied or exact): exactly one read of each input."""
    V = 640
    e = torch.full((1, V), -20.0)
    e[0, 100:110] = torch.linspace(0.0, 1.0, 10)  # the head: one block (64..127) only
    a = torch.randn(1, V, generator=torch.Generator().manual_seed(0))
    r_e = LogitReads(e, monkeypatch)
    tok, lp = _fused(e, a, 0.1, 0.5, tile=64, top_k=5, seed=1)
    assert r_e.bytes == e.numel() * 4  # block 1's own head is the row's: clean
    assert torch.equal(tok, _on_scores(e, a, 0.1, 0.5, tile=64, top_k=5, seed=1)[0])
    # a second block whose max is inside the row's head but whose head reaches below it
    e[0, 300] = 0.5
    e[0, 301] = -1.6  # in block 4's own head (>= 0.5 + log 0.1), outside the row's (1 - 2.30)
    r_e.bytes = 0
    tok, lp = _fused(e, a, 0.1, 0.5, tile=64, top_k=5, seed=1)
    assert r_e.bytes == e.numel() * 4 + 64 * 4  # one dirty block re-read
    want = _on_scores(e, a, 0.1, 0.5, tile=64, top_k=5, seed=1)
    assert torch.equal(tok, want[0]) and torch.equal(lp, want[1])


def test_edge_rows():
    """NaN in the amateur only (in an emptied block), a = -inf or +inf on the head, e = +inf,
    +inf - +inf, a flat expert row: the twin's verdict row by row."""
    V = 300
    e, a = _pair(6, V, 7)
    e[0, 250] = -40.0
    a[0, 250] = NAN                   # far outside the head: the row is still invalid
    a[1, int(e[1].argmax())] = -INF   # head token with score +inf: only it is kept
    a[2, int(e[2].argmax())] = INF    # the amateur is certain: that token is removed
    e[3, 17] = INF                    # expert +inf: the head is the +inf tokens
    e[4, 17] = INF
    a[4, 17] = INF                    # +inf - +inf: undefined, invalid row
    e[5] = 0.0                        # flat: every token in the head
    kw = dict(tile=64, top_p=0.9, temperature=0.9)
    want_p = _on_scores(e, a, 0.1, 0.5, write_probs=True, **kw)
    got_p = _fused(e, a, 0.1, 0.5, write_probs=True, **kw)
    assert torch.equal(got_p, want_p)
    tok, lp = _fused(e, a, 0.1, 0.5, seed=2, **kw)
    want = _on_scores(e, a, 0.1, 0.5, seed=2, **kw)
    assert torch.equal(tok, want[0]) and torch.equal(lp, want[1])
    assert tok[0] == -1 and tok[4] == -1 and tok[1] == int(e[1].argmax()) and tok[3] == 17


def test_invalid_per_row_cd_parameters():
    e, a = _pair(3, 200, 8)
    alpha = torch.tensor([0.1, NAN, 1.5])
    beta = torch.tensor([-1.0, 0.5, 0.5])
    tok, lp = _fused(e, a, alpha, beta, tile=64, seed=1)
    assert (tok == -1).all() and (lp == -INF).all()


def test_workspace_is_written_before_read(monkeypatch):
    ks = _ks()
    e, a = _pair(2, 500, 9)
    e[1, 64:400] = e[1].max() - 0.5  # a wide head of ties: fallback and dirty blocks
    kw = dict(tile=64, cand=16, top_p=0.9, seed=torch.tensor([4, 5]), offset=1)
    clean = _fused(e, a, 0.1, 0.5, **kw)
    clean_p = _fused(e, a, 0.1, 0.5, tile=64, cand=16, top_p=0.9, write_probs=True)

    def poisoned(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.fill_(NAN if dtype.is_floating_point else 0x7F7F7F7F)

    monkeypatch.setattr(ks, "_workspace", poisoned)
    got = _fused(e, a, 0.1, 0.5, **kw)
    assert torch.equal(got[0], clean[0]) and torch.equal(got[1], clean[1])
    assert torch.equal(_fused(e, a, 0.1, 0.5, tile=64, cand=16, top_p=0.9, write_probs=True),
                       clean_p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_public_sample_half_inputs_match_torch_backend(dtype):
    e, a = _pair(3, 500, 10)
    e, a = e.to(dtype), a.to(torch.bfloat16)
    kw = dict(temperature=0.7, top_k=30, top_p=0.9, seed=torch.tensor([1, 2, 3]),
              amateur_logits=a, cd_alpha=0.05, cd_beta=torch.tensor([0.5, 0.0, 2.0]),
              return_logprobs=True)
    t_tok, t_lp = gpu_sampler.sample(e, backend="triton", **kw)
    c_tok, c_lp = gpu_sampler.sample(e, backend="torch", **kw)
    assert torch.equal(t_tok, c_tok)
    torch.testing.assert_close(t_lp, c_lp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_public_errors_name_the_row_and_input(backend):
    e, a = _pair(3, 100, 11)
    a2 = a.clone()
    a2[2, 5] = NAN
    with pytest.raises(ValueError, match="amateur_logits row 2 contains NaN"):
        gpu_sampler.sample(e, amateur_logits=a2, backend=backend)
    e2, a3 = e.clone(), a.clone()
    e2[1, 3] = INF
    a3[1, 3] = INF
    with pytest.raises(ValueError, match="contrastive score of row 1 is undefined"):
        gpu_sampler.sampling_distribution(e2, amateur_logits=a3, backend=backend)
    # the amateur removes the only head token: the generic message, about the scores
    e3 = torch.tensor([[0.0, -INF, -INF, -INF]])
    with pytest.raises(ValueError, match="row 0 has no finite logit left"):
        gpu_sampler.sample(e3, amateur_logits=torch.tensor([[INF, 0.0, 0.0, 0.0]]), cd_beta=1.0,
                           backend=backend)
