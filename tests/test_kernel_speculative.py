"""speculative_sample() on the Triton backend, under the interpreter: the torch twin's tokens
and accepted counts exactly, its logprobs within rounding, for one-hot drafts (one sampling
launch over the B (K + 1) target rows, each read once) and for draft distributions; per-row
parameters, penalties over the extended history, tie-heavy / -inf-heavy / flat rows, invalid
rows with check=False."""
import pytest
import torch

from conftest import BACKENDS, DEVICE
from gpu_sampler import rng, sampling_distribution, speculative_sample
from test_kernel_v2 import LogitReads

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

V = 517  # odd: the last block is short
K = 2
B = 4
# greedy on Gaussian rows, top-k / top-p on tie-heavy rows, min-p on -inf-heavy rows, a wide
# nucleus on flat rows (the band read)
ROWS = dict(temperature=torch.tensor([0.0, 0.8, 1.0, 0.7]), top_k=torch.tensor([0, 20, 0, 0]),
            top_p=torch.tensor([1.0, 0.9, 1.0, 0.95]), min_p=torch.tensor([0.0, 0.0, 0.05, 0.0]))


def _target(g):
    """[B, K + 1, V]: Gaussian, tie-heavy, -inf-heavy and flat rows."""
    x = torch.randn(B, K + 1, V, generator=g) * 3
    x[1] = torch.randint(-3, 3, x[1].shape, generator=g).float()
    x[2, :, 9:] = float("-inf")
    x[3] = torch.randn(x[3].shape, generator=g) * 0.3
    return x


CUT = [2, 1, 0, 2]


def _drafts(x, **kw):
    """Drafts equal to the target's own draws (each seeing the drafts before it in the
    history) up to CUT, then one that is not: what the acceptance test must tell apart."""
    d = torch.zeros(x.shape[0], K, dtype=torch.long)
    for j in range(K):
        drawn, _ = speculative_sample(x, d, **kw, backend="torch")
        d[:, j] = torch.where(torch.tensor(CUT) > j, drawn[:, j], (drawn[:, j] + 1) % V)
    return d


def _both(x, d, q=None, reads=None, **kw):
    tw = speculative_sample(x, d, q, backend="torch", return_logprobs=True, **kw)
    if reads is not None:
        reads.bytes = 0
    kt = speculative_sample(x, d, q, backend="triton", return_logprobs=True, **kw)
    assert torch.equal(kt.tokens, tw.tokens)
    assert torch.equal(kt.num_accepted, tw.num_accepted)
    torch.testing.assert_close(kt.logprobs, tw.logprobs, atol=2e-5, rtol=1e-5)
    return kt


def test_one_hot_drafts_match_the_twin_in_one_read(monkeypatch):
    g = torch.Generator().manual_seed(1)
    x = _target(g)
    bounded = dict(ROWS, top_p=torch.tensor([1.0, 0.9, 1.0, 1.0]))  # no flat nucleus
    kw = dict(**bounded, repetition_penalty=1.3, presence_penalty=0.2,
              input_ids=torch.randint(0, 9, (B, 7), generator=g), seed=torch.arange(B) + 3,
              offset=torch.tensor([0, 5, 9, 1]))
    d = _drafts(x, **kw)
    reads = LogitReads(x, monkeypatch)
    out = _both(x, d, reads=reads, **kw)
    assert reads.bytes == x.numel() * x.element_size()  # each target row read once
    # the drafts that equal the draws are accepted, up to the first that does not
    assert out.num_accepted.tolist() == CUT


def test_draft_distributions_match_the_twin():
    g = torch.Generator().manual_seed(2)
    x = _target(g)
    q = torch.softmax(x[:, :K] * 0.7 + torch.randn(B, K, V, generator=g), -1)
    d = torch.stack([torch.multinomial(q[b, i], 1, generator=g)[0]
                     for b in range(B) for i in range(K)]).view(B, K)
    d[0] = x[0, :K].argmax(-1)  # the greedy row accepts, then takes the bonus
    kw = dict(**ROWS, frequency_penalty=0.3, input_ids=torch.randint(0, V, (B, 4), generator=g),
              seed=11, offset=torch.arange(B))
    out = _both(x, d, q, **kw)
    assert int(out.num_accepted[0]) == K


def test_bf16_and_invalid_rows_with_check_false():
    g = torch.Generator().manual_seed(3)
    x = _target(g).to(torch.bfloat16)
    x[2, 1, 3] = float("nan")                      # a NaN position: the row emits -1
    d = torch.randint(0, 9, (B, K), generator=g)
    d[1, 1] = V                                    # a draft outside [0, V)
    out = _both(x, d, **ROWS, seed=5, check=False)
    assert out.tokens[1:3].eq(-1).all() and out.num_accepted[1:3].eq(0).all()
    assert out.tokens[[0, 3], 0].ge(0).all()


def _twin_residual_draws(rows, q, d, seed, offset, flat):
    """Every position's residual draw by the twin's arithmetic: rows [R, V] target rows with
    per-row parameters ``flat``, q [B, K, V], d [B, K]: (tokens [R], log p [R], p_d [R]) as
    kernels/residual.py defines them."""
    R, Vr = rows.shape
    Bq, Kq = d.shape
    P = sampling_distribution(rows, **flat, backend="torch", check=False)
    Qf = torch.cat([q.float(), torch.zeros(Bq, 1, Vr)], 1).view(R, Vr)
    r = (P - Qf).clamp_min(0)
    r = torch.where((r.sum(1) > 0)[:, None], r, P)
    ids = torch.arange(Vr).expand(R, Vr)
    score = torch.where(r > 0, torch.log(r) + rng.gumbel_rows(seed, offset, ids), float("-inf"))
    tok = rng.first_best(score, ids, Vr)[0]
    dd = torch.cat([d, torch.zeros(Bq, 1, dtype=torch.long)], 1).view(R)
    return tok, torch.log(P.gather(1, tok[:, None])).squeeze(1), P.gather(1, dd[:, None])[:, 0]


def test_residual_draw_at_every_position_and_one_read_when_bounded(monkeypatch):
    """The fused launches' per-position outputs (not only the position the acceptance test
    picks) equal the twin's: rows decided on the candidates (greedy, top-k), rows read twice
    (pure temperature, min-p alone, a wide flat nucleus). With only bounded rows, the target
    is read once."""
    g = torch.Generator().manual_seed(4)
    x = _target(g)
    x[2] = torch.randn(x[2].shape, generator=g) * 2  # pure temperature on a Gaussian row
    q = torch.softmax(x[:, :K] * 0.5 + torch.randn(B, K, V, generator=g), -1)
    d = torch.randint(0, V, (B, K), generator=g)
    rows = x.reshape(B * (K + 1), V)
    seed, offset = torch.arange(B * (K + 1)) + 40, torch.arange(B * (K + 1)) % 3
    from gpu_sampler import kernels
    for kw in (dict(temperature=torch.tensor([0.0, 0.8, 1.0, 0.7]),
                    top_k=torch.tensor([0, 20, 0, 0]), top_p=torch.tensor([1.0, 0.9, 1.0, 0.95]),
                    min_p=torch.tensor([0.0, 0.0, 0.0, 0.0])),
               dict(temperature=torch.tensor([0.7, 0.8, 1.0, 1.0]),
                    top_k=torch.tensor([0, 0, 5, 0]), top_p=torch.tensor([1.0, 1.0, 1.0, 1.0]),
                    min_p=torch.tensor([0.1, 0.0, 0.0, 0.02]))):
        flat = {k: v.repeat_interleave(K + 1) for k, v in kw.items()}
        tok, logp, p_d = kernels.fused_sample(rows, seed=seed, offset=offset, residual=(q, d),
                                              **flat)
        t_tok, t_logp, t_pd = _twin_residual_draws(rows, q, d, seed, offset, flat)
        assert torch.equal(tok, t_tok)
        torch.testing.assert_close(logp, t_logp, atol=2e-5, rtol=1e-5)
        at_drafts = torch.arange(B * (K + 1)) % (K + 1) < K  # no draft at the bonus position
        torch.testing.assert_close(p_d[at_drafts], t_pd[at_drafts], atol=1e-6, rtol=1e-5)
        assert (t_pd[at_drafts] > 0).sum() >= 3  # some drafts are in the kept sets
    # rows read again (pure temperature): the same at one program a row as at many, and with
    # every scratch buffer poisoned (each is written before it is read)
    one = kernels.fused_sample(rows, seed=seed, offset=offset, residual=(q, d), chunks=1, **flat)
    assert torch.equal(one[0], tok) and torch.equal(one[1], logp) and torch.equal(one[2], p_d)
    from gpu_sampler.kernels import sampling as ks

    def poisoned(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.fill_(float("nan") if dtype.is_floating_point else 0x7F7F)

    monkeypatch.setattr(ks, "_workspace", poisoned)
    bad = kernels.fused_sample(rows, seed=seed, offset=offset, residual=(q, d), **flat)
    assert torch.equal(bad[0], tok) and torch.equal(bad[1], logp) and torch.equal(bad[2], p_d)
    monkeypatch.undo()
    bounded = dict(temperature=0.7, top_k=torch.tensor([5, 20, 50, 1]).repeat_interleave(K + 1),
                   top_p=0.9)
    reads = LogitReads(rows, monkeypatch)
    reads.bytes = 0
    kernels.fused_sample(rows, seed=seed, offset=offset, residual=(q, d), **bounded)
    assert reads.bytes == rows.numel() * rows.element_size()


def test_residual_after_the_row_pass_in_one_program(monkeypatch):
    """Scalar top-p on flat rows wider than the candidates: the merge's row pass decides the
    kept set, and (no row can be pure or min-p alone) the residual launch reads such a row in
    its one program, with no finish launch: the same draws as the twin's."""
    from gpu_sampler import kernels
    g = torch.Generator().manual_seed(5)
    Vw, Kw = 9001, 1  # 9 blocks of 1024, 512 candidate slots each
    rows = torch.randn(2 * (Kw + 1), Vw, generator=g) * 0.3
    q = torch.softmax(rows.view(2, Kw + 1, Vw)[:, :Kw] + torch.randn(2, Kw, Vw, generator=g), -1)
    d = torch.randint(0, Vw, (2, Kw), generator=g)
    seed, offset = torch.tensor([3, 3, 8, 8]), torch.tensor([0, 1, 5, 6])
    kw = dict(temperature=1.0, top_p=0.95)
    reads = LogitReads(rows, monkeypatch)
    tok, logp, p_d = kernels.fused_sample(rows, seed=seed, offset=offset, residual=(q, d), **kw)
    assert reads.bytes > 2 * rows.numel() * rows.element_size()  # the row pass, then ours
    flat = {k: torch.full((4,), v) for k, v in kw.items()}
    t_tok, t_logp, t_pd = _twin_residual_draws(rows, q, d, seed, offset, flat)
    assert torch.equal(tok, t_tok)
    torch.testing.assert_close(logp, t_logp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(p_d[::2], t_pd[::2], atol=1e-6, rtol=1e-5)
