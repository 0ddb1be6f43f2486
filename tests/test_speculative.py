"""speculative_sample(): exact in distribution, the acceptance rule, the bonus token, errors."""
import pytest
import torch

import gpu_sampler
from gpu_sampler import speculative_sample
from tests.chisq import pvalue

V = 12
N = 6000  # rows (one seed each) per distribution test


def _rows(x, n=N):
    return x.expand(n, *x.shape[1:]).contiguous()


def _draft_probs(kind, target, g):
    """q for position 0 and 1 of one row: [1, 2, V]."""
    logits = target[:, :2]
    if kind == "sharper":
        return torch.softmax(logits * 3, -1)
    if kind == "flatter":
        return torch.softmax(logits * 0.3, -1)
    if kind == "equal":
        return gpu_sampler.sampling_distribution(logits[0], top_k=0)[None]
    if kind == "disjoint":  # mass only where the target (top-k 4) puts none
        p = gpu_sampler.sampling_distribution(logits[0], top_k=4)
        q = (p == 0).float()
        return (q / q.sum(-1, keepdim=True))[None]
    return None  # one-hot of the draft token


@pytest.mark.parametrize("kind", ["sharper", "flatter", "equal", "disjoint", "onehot"])
def test_first_token_is_distributed_as_the_target(kind):
    g = torch.Generator().manual_seed(11)
    target = torch.randn(1, 3, V, generator=g) * 1.5
    q = _draft_probs(kind, target, g)
    top_k = 4 if kind == "disjoint" else 0
    if q is None:
        drafts = torch.randint(0, V, (N, 2), generator=g)
    else:  # drafts drawn from q, as a draft model would
        drafts = torch.stack([torch.multinomial(q[0, i], N, replacement=True, generator=g)
                              for i in range(2)], 1)
        q = _rows(q)
    tok, n = speculative_sample(_rows(target), drafts, q, top_k=top_k, seed=torch.arange(N))
    p0 = gpu_sampler.sampling_distribution(target[:, 0], top_k=top_k)[0]
    assert pvalue(tok[:, 0], p0) > 1e-3
    if kind == "equal":
        assert bool((n == 2).all())  # p / q = 1: every draft is accepted
    if kind == "disjoint":
        assert bool((n == 0).all())  # q puts no mass where p does: never accepted


def test_second_token_given_the_first_accepted_sees_it_in_the_history():
    g = torch.Generator().manual_seed(12)
    target = torch.randn(1, 3, V, generator=g)
    q = _rows(torch.softmax(torch.randn(1, 2, V, generator=g), -1))
    drafts = torch.stack([torch.multinomial(q[0, i], N, replacement=True, generator=g)
                          for i in range(2)], 1)
    history = torch.tensor([[3, 3, 5]])
    kw = dict(repetition_penalty=2.5, temperature=0.8)
    tok, n = speculative_sample(_rows(target), drafts, q, input_ids=_rows(history),
                                seed=torch.arange(N), **kw)
    for d0 in range(V):  # given d_0 accepted: position 1 is p_1 with d_0 in the history
        rows = (n >= 1) & (drafts[:, 0] == d0)
        if int(rows.sum()) < 400:
            continue
        hist = torch.cat([history, torch.tensor([[d0]])], 1)
        p1 = gpu_sampler.sampling_distribution(target[:, 1], input_ids=hist, **kw)[0]
        assert pvalue(tok[rows, 1], p1) > 1e-3, d0


def test_greedy_rows_accept_while_the_draft_is_the_argmax():
    g = torch.Generator().manual_seed(13)
    target = torch.randint(-2, 3, (5, 9, V), generator=g).float()  # ties at the max
    greedy = target.argmax(-1)  # lowest id on ties
    drafts = greedy[:, :8].clone()
    cut = torch.tensor([0, 3, 8, 5, 1])
    for b, c in enumerate(cut.tolist()):
        if c < 8:
            drafts[b, c] = (greedy[b, c] + 1) % V
    tok, n = speculative_sample(target, drafts, temperature=0.0, seed=1)
    assert torch.equal(n, cut)
    for b, c in enumerate(cut.tolist()):
        assert torch.equal(tok[b, :c + 1], greedy[b, :c + 1])
        assert bool((tok[b, c + 1:] == -1).all())


def test_greedy_fast_path_equals_the_general_path():
    # A number 0 takes the argmax-only path; a per-row tensor of zeros the general one.
    g = torch.Generator().manual_seed(5)
    target = torch.randint(-2, 3, (6, 5, V), generator=g).float()  # ties at the max
    drafts = target.argmax(-1)[:, :4].clone()
    drafts[1, 2] = (drafts[1, 2] + 1) % V
    drafts[2, 0] = V + 3                        # a bad draft row
    target[3, 1] = float("nan")                 # a NaN position
    target[4, 4] = float("-inf")                # nothing left at the bonus position
    for args in ((), (None,)):
        fast = speculative_sample(target, drafts, *args, temperature=0.0, check=False,
                                  return_logprobs=True)
        slow = speculative_sample(target, drafts, *args, temperature=torch.zeros(6),
                                  check=False, return_logprobs=True)
        for a, b in zip(fast, slow):
            assert torch.equal(a, b)
    assert fast.num_accepted.tolist() == [4, 2, 0, 0, 0, 4]
    with pytest.raises(ValueError, match="row 0, position 1 contains NaN"):
        speculative_sample(target[3:4], drafts[3:4], temperature=0.0)


def test_bonus_token_is_sample_at_the_last_position():
    """Gumbel-max over p_K with position K's stream: sample()'s token (the two differ only
    where two scores tie within rounding; none do here)."""
    g = torch.Generator().manual_seed(14)
    target = torch.randn(6, 4, 50, generator=g)
    probs = gpu_sampler.sampling_distribution(target[:, :3].reshape(18, 50)).view(6, 3, 50)
    drafts = probs.argmax(-1)
    seeds, offs = torch.arange(6) + 100, torch.arange(6) * 7
    tok, n = speculative_sample(target, drafts, probs, seed=seeds, offset=offs)
    assert bool((n == 3).all())  # q = p: all accepted
    want = gpu_sampler.sample(target[:, 3], seed=seeds, offset=offs + 3)
    assert torch.equal(tok[:, 3], want)


def test_per_row_parameters_and_logprobs():
    g = torch.Generator().manual_seed(15)
    target = torch.randn(4, 3, 30, generator=g) * 2
    drafts = torch.randint(0, 30, (4, 2), generator=g)
    kw = dict(temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]), top_k=torch.tensor([0, 5, 0, 3]),
              top_p=torch.tensor([1.0, 0.9, 0.5, 1.0]))
    out = speculative_sample(target, drafts, seed=5, return_logprobs=True, **kw)
    for b in range(4):
        row = {k: v[b:b + 1] for k, v in kw.items()}
        one = speculative_sample(target[b:b + 1], drafts[b:b + 1], seed=5, **row)
        assert torch.equal(one[0][0], out.tokens[b]) and int(one[1]) == int(out.num_accepted[b])
        m = int(out.num_accepted[b]) + 1
        p = gpu_sampler.sampling_distribution(target[b, :m], **{
            k: v[b:b + 1].expand(m) for k, v in kw.items()})
        want = torch.log(p.gather(1, out.tokens[b, :m, None]).squeeze(1))
        torch.testing.assert_close(out.logprobs[b, :m], want)
        assert bool(torch.isinf(out.logprobs[b, m:]).all())


@pytest.mark.parametrize("K", [1, 8])
def test_same_seed_same_tokens_and_support(K):
    g = torch.Generator().manual_seed(16)
    target = torch.randn(16, K + 1, 40, generator=g)
    target[:, :, 20:] = float("-inf")
    drafts = torch.randint(0, 20, (16, K), generator=g)
    a = speculative_sample(target, drafts, top_p=0.8, seed=3)
    b = speculative_sample(target, drafts, top_p=0.8, seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    emitted = a[0][a[0] >= 0]
    assert bool((emitted < 20).all())


def _bad(kind):
    t, d = torch.randn(2, 3, 10), torch.randint(0, 10, (2, 2))
    q = torch.softmax(torch.randn(2, 2, 10), -1)
    if kind == "shape":
        return (t[0], d, None), "target_logits"
    if kind == "k0":
        return (t[:, :1], d[:, :0], None), "K=0"
    if kind == "draft_shape":
        return (t, d[:, :1], None), "draft_tokens"
    if kind == "token":
        d[1, 0] = 10
        return (t, d, None), "draft_tokens row 1"
    if kind == "negative":
        q[1, 0, 0] = -0.1
        return (t, d, q), "draft_probs row 1"
    if kind == "unnormalised":
        q[0, 1] *= 2
        return (t, d, q), "draft_probs row 0"
    if kind == "nan_probs":
        q[1, 1, 3] = float("nan")
        return (t, d, q), "draft_probs row 1"
    t[1, 2, 4] = float("nan")
    return (t, d, q), "target_logits row 1, position 2 contains NaN"


@pytest.mark.parametrize("kind", ["shape", "k0", "draft_shape", "token", "negative",
                                  "unnormalised", "nan_probs", "nan_logits"])
def test_invalid_inputs(kind):
    args, match = _bad(kind)
    with pytest.raises(ValueError, match=match):
        speculative_sample(*args, seed=1)
    if kind in ("token", "negative", "unnormalised", "nan_probs", "nan_logits"):
        tok, n = speculative_sample(*args, seed=1, check=False)
        r = int(match.split("row ")[1][0])
        assert bool((tok[r] == -1).all()) and int(n[r]) == 0
        assert bool((tok[1 - r, 0] >= 0).all())


def test_torch_op_and_torch_compile_fullgraph():
    """torch.ops.gpu_sampler.speculative_sample passes opcheck, and a compiled verification
    step (fullgraph: no graph break) gives the eager tokens."""
    g = torch.Generator().manual_seed(21)
    B, K, V = 3, 4, 60
    target = torch.randn(B, K + 1, V, generator=g) * 2
    drafts = torch.randint(0, V, (B, K), generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    hist = torch.randint(0, V, (B, 5), generator=g)
    seeds, pos = torch.tensor([3, 4, 5]), torch.tensor([7, 7, 9])
    r = lambda v, dt=torch.float32: torch.full((B,), v, dtype=dt)  # noqa: E731
    torch.library.opcheck(torch.ops.gpu_sampler.speculative_sample.default,
                          (target, drafts, q, r(0.8), r(10, torch.int64), r(0.9), r(0.0),
                           r(1.2), r(0.0), r(0.0), hist, None, seeds, pos, "auto"))

    def step(target, drafts, q, seeds, pos):
        return speculative_sample(target, drafts, q, temperature=torch.tensor([0.0, 0.8, 1.1]),
                                  top_k=torch.tensor([0, 10, 0]), top_p=0.9,
                                  repetition_penalty=1.2, input_ids=hist, seed=seeds,
                                  offset=pos, return_logprobs=True)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(target, drafts, q,
                                                                        seeds, pos)
    eager = step(target, drafts, q, seeds, pos)
    assert torch.equal(compiled.tokens, eager.tokens)
    assert torch.equal(compiled.num_accepted, eager.num_accepted)
    torch.testing.assert_close(compiled.logprobs, eager.logprobs)


def test_one_hot_drafts_emit_the_tokens_plain_sampling_gives():
    """Drafts without probabilities: position i emits sample()'s token for (seed, offset + i)
    with the accepted drafts in the history, and d_i is accepted iff it is that token."""
    g = torch.Generator().manual_seed(17)
    B, K, W = 8, 4, 30
    target = torch.randn(B, K + 1, W, generator=g) * 2
    hist = torch.randint(0, W, (B, 6), generator=g)
    kw = dict(temperature=0.9, top_k=torch.tensor([0, 8] * 4), repetition_penalty=1.4)
    seeds, offs = torch.arange(B) + 40, torch.arange(B) * 3
    plain = torch.empty(B, K + 1, dtype=torch.long)
    for i in range(K + 1):  # plain sampling, one position at a time
        h = torch.cat([hist, plain[:, :i]], 1)
        plain[:, i] = gpu_sampler.sample(target[:, i], input_ids=h, seed=seeds, offset=offs + i,
                                         **kw)
    cut = torch.tensor([0, 1, 2, 3, 4, 4, 2, 0])
    pos = torch.arange(K)[None, :]
    drafts = torch.where(pos < cut[:, None], plain[:, :K], (plain[:, :K] + 1) % W)
    tok, n = speculative_sample(target, drafts, input_ids=hist, seed=seeds, offset=offs, **kw)
    assert torch.equal(n, cut)
    for b in range(B):
        m = int(cut[b]) + 1
        assert torch.equal(tok[b, :m], plain[b, :m]) and bool((tok[b, m:] == -1).all())


def test_residual_draw_on_the_whole_row_equals_the_support_draw(monkeypatch):
    """The GPU's sync-free residual draw (noise for every id) picks what the CPU's draw on p's
    support picks."""
    from gpu_sampler import speculative
    g = torch.Generator().manual_seed(18)
    target = torch.randn(64, 3, 40, generator=g) * 2
    q = torch.softmax(torch.randn(64, 2, 40, generator=g), -1)
    drafts = torch.randint(0, 40, (64, 2), generator=g)
    kw = dict(top_k=torch.randint(0, 12, (64,), generator=g), top_p=0.9, seed=torch.arange(64))
    support = speculative_sample(target, drafts, q, **kw)
    monkeypatch.setattr(speculative, "_noise_on_support", lambda device: False)
    whole = speculative_sample(target, drafts, q, **kw)
    assert torch.equal(whole[0], support[0]) and torch.equal(whole[1], support[1])
    assert bool((support[1] < 2).any())  # residual draws happened
