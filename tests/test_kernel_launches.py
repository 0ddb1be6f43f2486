"""Launches skipped or shared (kernels/sampling.py ``_direct_history``, ``_Call.fuse``) under the
interpreter: the same tokens and logprobs, bit for bit, as the launches they replace."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")


def _ks():
    from gpu_sampler.kernels import sampling
    return sampling


class _Count:
    """A kernel wrapper that counts its launches."""

    def __init__(self, kernel):
        self.kernel, self.n = kernel, 0

    def __getitem__(self, grid):
        self.n += 1
        return self.kernel[grid]


def _same(a, b):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (a, b)


def test_direct_history_matches_bucketed(monkeypatch):
    """Stage 1 at one block a program (64-token blocks, 2 rows) with a repetition penalty and a
    short history skips the history launch; the same call planned for many rows (several
    blocks a program) buckets it: bit-identical, with padding, out-of-range and repeated ids,
    a per-row penalty, greedy rows and rows whose nucleus takes the merge's own re-reads."""
    ks = _ks()
    hist = _Count(ks._bucket_history_kernel)
    monkeypatch.setattr(ks, "_bucket_history_kernel", hist)
    gen = torch.Generator().manual_seed(3)
    V, B = 1000, 2
    x = torch.randn(B, V, generator=gen) * 2
    x[1, :500] = 0.25  # a flat stretch: dirty blocks / the row pass re-read with the penalty
    for L in (1, 256):
        ids = torch.randint(0, V, (B, L), generator=gen)
        ids[0, :: 5] = ids[0, 0]  # repeats
        ids[1, -1] = -1  # padding
        if L > 2:
            ids[0, 1] = V + 40  # past the vocabulary (check=False): touches nothing
        for kw in (dict(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05),
                   dict(temperature=0.0, repetition_penalty=1.3),
                   dict(temperature=1.0, top_k=900, repetition_penalty=torch.tensor([1.2, 0.8]))):
            kw = dict(kw, input_ids=ids, seed=torch.tensor([5, 6]), tile=64, cand=4)
            hist.n = 0
            direct = ks.fused_sample(x, **kw)
            assert hist.n == 0, "one block a program: no history launch"
            bucketed = ks.fused_sample(x, plan_batch=4096, **kw)
            assert hist.n == 1
            _same(direct, bucketed)
    # a longer history, presence penalties or non-contiguous rows keep the history launch
    ids = torch.randint(0, V, (B, 300), generator=gen)
    for kw in (dict(input_ids=ids, repetition_penalty=1.2),
               dict(input_ids=ids[:, :40], repetition_penalty=1.2),
               dict(input_ids=ids[:, :40].contiguous(), presence_penalty=0.5)):
        hist.n = 0
        ks.fused_sample(x, temperature=0.8, top_k=10, tile=64, **kw)
        assert hist.n == 1


def test_one_gather_for_both_hand_overs(monkeypatch):
    """A per-row batch with min-p-alone rows (the second read) and top-p rows whose nucleus
    outgrows the candidates (the band read): at a small batch one gather launch serves both
    (no _gather_kernel launch), planned for many rows they keep their own launches; either way
    the band finish finishes both (no _finish_kernel launch); the same tokens and logprobs."""
    ks = _ks()
    gather = _Count(ks._gather_kernel)
    finish = _Count(ks._finish_kernel)
    monkeypatch.setattr(ks, "_gather_kernel", gather)
    monkeypatch.setattr(ks, "_finish_kernel", finish)
    gen = torch.Generator().manual_seed(8)
    V, B = 1024, 5
    x = torch.rand(B, V, generator=gen) * 0.5  # flat rows: big nuclei, min-p keeps many
    kw = dict(temperature=torch.tensor([0.0, 1.0, 1.0, 0.7, 1.0]),
              top_k=torch.tensor([0, 0, 0, 50, 0]),
              top_p=torch.tensor([1.0, 1.0, 0.95, 1.0, 1.0]),
              min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05]),
              seed=torch.arange(B) + 1, offset=2, tile=64, cand=8)
    fused = ks.fused_sample(x, **kw)
    assert gather.n == 0
    apart = ks.fused_sample(x, plan_batch=4096, **kw)
    assert gather.n == 1 and finish.n == 0
    _same(fused, apart)
    from gpu_sampler import reference
    kw = {k: v for k, v in kw.items() if k not in ("tile", "cand")}
    want = reference.sample_reference(x, **kw)
    assert torch.equal(fused[0], want[0])


def test_gather_finishes_its_rows(monkeypatch):
    """Rows handed to the second read (flat min-p rows) are finished by their last gather
    program (kernels/second.py FINISH: a ticket per row, reset by the merge): no finish launch,
    whether every row is handed over (each keeps its stage-1 programs) or one of three (it
    shares the grid), with a NaN-poisoned workspace (the ticket starts from the merge's reset)
    and at 1 / 3 chunks; with presence penalties the finish keeps its launch. The twin's
    tokens and logprobs, the same bits either way."""
    ks = _ks()
    gather, finish = _Count(ks._gather_kernel), _Count(ks._finish_kernel)
    monkeypatch.setattr(ks, "_gather_kernel", gather)
    monkeypatch.setattr(ks, "_finish_kernel", finish)
    from test_kernel_band import _check
    x = torch.randn(3, 1031, generator=torch.Generator().manual_seed(91))
    every = dict(temperature=1.0, min_p=torch.tensor([0.05, 0.02, 0.1]))
    one = dict(temperature=1.0, min_p=torch.tensor([0.0, 0.05, 0.0]),
               top_k=torch.tensor([20, 0, 50]))
    for kw in (every, one):
        kw = dict(kw, seed=torch.arange(3) + 5, offset=torch.arange(3))
        gather.n = finish.n = 0
        got = ks.fused_sample(x, tile=64, cand=8, **kw)
        assert (gather.n, finish.n) == (1, 0)
        _check(x, kw, *got)
        _same(got, ks.fused_sample(x, tile=64, cand=8, chunks=1, **kw))
        _same(got, ks.fused_sample(x, tile=64, cand=8, chunks=3, **kw))
    pf = dict(every, presence_penalty=0.3, input_ids=torch.randint(0, 1031, (3, 40)),
              seed=torch.arange(3) + 5)
    finish.n = 0
    clean = ks.fused_sample(x, tile=64, cand=8, **pf)
    assert finish.n == 1
    _check(x, pf, *clean)

    def poisoned(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.fill_(float("nan")) if dtype.is_floating_point else t.fill_(0x7F7F7F7F)

    kw = dict(every, seed=torch.arange(3) + 5, offset=torch.arange(3))
    want = ks.fused_sample(x, tile=64, cand=8, **kw)
    monkeypatch.setattr(ks, "_workspace", poisoned)
    _same(want, ks.fused_sample(x, tile=64, cand=8, **kw))
    _same(clean, ks.fused_sample(x, tile=64, cand=8, **pf))
