"""Kernel v2 (kernels/stats.py + kernels/merge.py) under the interpreter: invariance to the
chunking and the batch, every exact fallback on purpose, long penalty histories, a reduced
large-vocabulary case, and a poisoned workspace."""
import numpy as np
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")


def _ks():
    from gpu_sampler.kernels import sampling
    return sampling


def _run(x, **kw):
    return _ks().fused_sample(x, **kw)


def _twin_tokens(x, **kw):
    from gpu_sampler import reference
    kw = {k: v for k, v in kw.items() if k not in ("tile", "chunks", "cand")}
    return reference.sample_reference(x, **kw)


class LogitReads:
    """Bytes the kernels load from one tensor (every unmasked tl.load lane, by address)."""

    def __init__(self, t, monkeypatch):
        from triton.runtime import interpreter as ti
        self.lo = t.untyped_storage().data_ptr()
        self.hi = self.lo + t.untyped_storage().nbytes()
        self.bytes = 0
        orig = ti.InterpreterBuilder.create_masked_load

        def load(b, ptrs, mask, other, cache_policy, is_volatile):
            a = np.asarray(ptrs.data, dtype=np.uint64)
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), a.shape)
            hit = m & (a >= self.lo) & (a < self.hi)
            self.bytes += int(hit.sum()) * t.element_size()
            return orig(b, ptrs, mask, other, cache_policy, is_volatile)

        monkeypatch.setattr(ti.InterpreterBuilder, "create_masked_load", load)


def _mixed(B, V, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=gen) * 3
    ids = torch.randint(0, V, (B, 40), generator=gen)
    kw = dict(temperature=torch.tensor([0.7, 1.0, 0.0, 1.3])[:B],
              top_k=torch.tensor([50, 0, 5, 20])[:B], top_p=torch.tensor([0.9, 0.8, 1.0, 1.0])[:B],
              min_p=torch.tensor([0.0, 0.02, 0.0, 0.0])[:B], repetition_penalty=1.2,
              presence_penalty=0.3, frequency_penalty=0.1, input_ids=ids,
              prompt_lens=torch.tensor([3, 0, 10, 40])[:B], seed=torch.arange(B) + 7, offset=5)
    return x, kw


def test_chunk_count_and_batch_invariance():
    """Same token and bit-identical logprob at 1, 3 and 16 chunks, and for sub-batches."""
    V = 1000
    x, kw = _mixed(4, V, 1)
    ref_tok, ref_lp = _run(x, tile=64, chunks=1, **kw)
    for chunks in (16,):
        tok, lp = _run(x, tile=64, chunks=chunks, **kw)
        assert torch.equal(tok, ref_tok) and torch.equal(lp, ref_lp), chunks
    for rows, chunks in (([2, 0], 5), ([3, 1], 3)):
        r = torch.tensor(rows)
        sub = {k: (v[r] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == 4 else v)
               for k, v in kw.items()}
        tok, lp = _run(x[r], tile=64, chunks=chunks, **sub)
        assert torch.equal(tok, ref_tok[r]) and torch.equal(lp, ref_lp[r]), rows
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(ref_tok, tw_tok)
    torch.testing.assert_close(ref_lp, tw_lp, atol=1e-5, rtol=1e-5)


FALLBACKS = [
    # (name, logits maker, kwargs, candidate slots per 64-token block)
    ("ties", lambda g: torch.randint(0, 3, (2, 640), generator=g).float(),
     dict(top_k=40, temperature=0.8), 8),
    ("flat", lambda g: torch.zeros(2, 640), dict(top_k=5, top_p=0.5), 8),
    ("huge-nucleus", lambda g: torch.randn(2, 640, generator=g) * 0.1, dict(top_p=0.95), 8),
    # (no filter at all, pure temperature, reads once since v3: tests/test_kernel_v3.py)
    ("min-p-wide", lambda g: torch.randn(2, 640, generator=g) * 0.5, dict(min_p=0.01), 8),
]


@pytest.mark.parametrize("name,make,kw,cand", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_fallbacks_are_exact(name, make, kw, cand, monkeypatch):
    """Rows the candidates cannot decide re-read the row (counted) and still give the twin's
    tokens and HF's distribution; a bounded row reads the logits exactly once."""
    from hf_reference import assert_matches_hf
    g = torch.Generator().manual_seed(len(name))
    x = make(g)
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, cand=cand, seed=3, offset=torch.arange(2), **kw)
    assert reads.bytes > 1.5 * x.numel() * 4, f"{name}: fallback not taken"
    tw_tok, tw_lp = _twin_tokens(x, seed=3, offset=torch.arange(2), **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    probs = _run(x, tile=64, cand=cand, write_probs=True, **kw)
    assert_matches_hf(probs, x, name, **kw)
    # the same rows with room for every candidate: one read, same answer
    reads.bytes = 0
    tok2, lp2 = _run(x, tile=64, cand=64, seed=3, offset=torch.arange(2), **kw)
    assert reads.bytes == x.numel() * 4
    assert torch.equal(tok2, tok)


def test_bounded_rows_read_once(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3000, generator=gen) * 3
    ids = torch.randint(0, 3000, (2, 64), generator=gen)
    reads = LogitReads(x, monkeypatch)
    for kw in (dict(top_k=50, top_p=0.9, temperature=0.7, repetition_penalty=1.2, input_ids=ids),
               dict(top_p=0.9, temperature=0.7), dict(top_k=1000), dict(min_p=0.1)):
        reads.bytes = 0
        _run(x, tile=256, seed=1, **kw)
        assert reads.bytes == x.numel() * 4, kw


@pytest.mark.parametrize("L,B", [(4096, 2)])  # L > 2048 and > 256 edits a block
def test_long_history_matches_hf(L, B):
    """Repetition (HF processor) then presence/frequency (OpenAI rule) over long histories."""
    from transformers import RepetitionPenaltyLogitsProcessor
    V = 300
    gen = torch.Generator().manual_seed(L)
    x = torch.randn(B, V, generator=gen) * 2
    ids = torch.randint(0, V, (B, L), generator=gen)
    ids[:, ::7] = torch.randint(0, 20, (B, len(range(0, L, 7))), generator=gen)  # heavy repeats
    plen = L // 3
    rp, pres, freq = 1.3, 0.2, 0.001
    expect = RepetitionPenaltyLogitsProcessor(rp)(ids, x.clone())
    cnt = torch.zeros(B, V).scatter_add_(1, ids[:, plen:], torch.ones(B, L - plen))
    expect = expect - (pres * (cnt > 0) + freq * cnt)
    probs = _run(x, tile=64, repetition_penalty=rp, presence_penalty=pres, frequency_penalty=freq,
                 input_ids=ids, prompt_lens=plen, write_probs=True)
    torch.testing.assert_close(probs, torch.softmax(expect, -1), atol=1e-6, rtol=1e-4)


def test_reduced_large_vocab():
    """Default geometry (1024-token blocks, 64+ slots each) on V = 20000: HF's distribution
    and the twin's tokens (chunk invariance: test_chunk_count_and_batch_invariance)."""
    from hf_reference import assert_matches_hf
    gen = torch.Generator().manual_seed(9)
    B, V = 2, 20000
    x = (torch.randn(B, V, generator=gen) * 3).to(torch.bfloat16)
    ids = torch.randint(0, V, (B, 128), generator=gen)
    kw = dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2, input_ids=ids)
    tok, lp = _run(x, seed=4, offset=1, **kw)
    tw_tok, _ = _twin_tokens(x, seed=4, offset=1, **kw)
    assert torch.equal(tok, tw_tok)
    assert_matches_hf(_run(x, write_probs=True, **kw), x.float(), "V=20000", **kw)


def test_numeric_policy_rows():
    """Per-row NaN / inf parameters make the row invalid; an overflowed row keeps the argmax
    tie group of xp only (not every token that overflowed)."""
    x = torch.tensor([[1e38, 3e38, 3e38, 0.0]] * 6)
    nan, inf = float("nan"), float("inf")
    kw = dict(temperature=torch.tensor([1e-6, inf, 1.0, 1.0, 1.0, 1.0]),
              repetition_penalty=torch.tensor([1.0, 1.0, inf, 1.0, 1.0, 1.0]),
              presence_penalty=torch.tensor([0.0, 0.0, 0.0, -inf, 0.0, 0.0]),
              frequency_penalty=torch.tensor([0.0, 0.0, 0.0, 0.0, nan, 0.0]),
              top_p=torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.5]),
              input_ids=torch.tensor([[3]] * 6))
    probs = _run(x, write_probs=True, **kw)
    assert torch.equal(probs[0], torch.tensor([0.0, 0.5, 0.5, 0.0]))
    assert (probs[1:] == 0).all()
    tok, lp = _run(x, seed=1, **kw)
    assert tok[0] in (1, 2) and lp[0] == -torch.log(torch.tensor(2.0))
    assert (tok[1:] == -1).all() and (lp[1:] == float("-inf")).all()


def test_workspace_is_written_before_read(monkeypatch):
    """Scratch buffers full of NaN / 0x7F.. garbage change nothing."""
    ks = _ks()
    x, kw = _mixed(4, 700, 3)
    x[1, 5:600] = 0.25  # a tie-heavy row: the fallback reads the workspace too
    clean = [_run(x, tile=64, cand=16, **kw)]
    kw_d = {k: v for k, v in kw.items() if k not in ("seed", "offset")}
    clean.append(_run(x, tile=64, cand=16, write_probs=True, **kw_d))

    def poisoned(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        if dtype.is_floating_point:
            return t.fill_(float("nan"))
        return t.fill_(0x7F7F7F7F if dtype.itemsize >= 4 else 0x7F7F)  # int16: band counts

    monkeypatch.setattr(ks, "_workspace", poisoned)
    tok, lp = _run(x, tile=64, cand=16, **kw)
    assert torch.equal(tok, clean[0][0]) and torch.equal(lp, clean[0][1])
    assert torch.equal(_run(x, tile=64, cand=16, write_probs=True, **kw_d), clean[1])


def test_small_top_k_bound_from_block_maxima(monkeypatch):
    """k <= blocks: the k-th largest block max bounds tau, and blocks whose max is below it are
    not visited by the compaction. Tied block maxima, per-row k at and around the block count,
    with and without top-p: HF's distribution, the twin's tokens, one read of the logits."""
    from hf_reference import assert_matches_hf
    gen = torch.Generator().manual_seed(13)
    B, V = 4, 32 * 64 - 5  # 32 blocks of 64, the last one short
    x = torch.randn(B, V, generator=gen) * 2
    x[1, ::64] = 7.0  # every block of row 1 has the same max: k-th block max == the max
    x[2, 100:104] = 9.0  # four tied top values in one block
    kw = dict(top_k=torch.tensor([3, 10, 4, 32]), top_p=torch.tensor([1.0, 0.9, 1.0, 0.5]),
              temperature=0.8)
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, seed=torch.arange(B) + 1, offset=2, **kw)
    assert reads.bytes == x.numel() * 4
    tw_tok, tw_lp = _twin_tokens(x, seed=torch.arange(B) + 1, offset=2, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    assert_matches_hf(_run(x, tile=64, write_probs=True, **kw), x, "small k", **kw)
