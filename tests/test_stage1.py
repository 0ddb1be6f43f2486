"""Stage 1 (kernels/stats.py) paths that random rows never take, under the interpreter: blocks
with NaN / +inf / an x that overflows (the flagged exact recount), all -inf blocks, greedy
rows whose first maximum is found from the candidates or by re-reading one block (greedy
blocks: each block's first maximum as its one candidate), and the packed slot scan at full 1024- and 256-token tiles. Each compares with the torch twin."""
import pytest
import torch

from conftest import BACKENDS, DEVICE
from test_kernel_v2 import LogitReads, _run, _twin_tokens

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")


def _same_as_twin(x, **kw):
    tok, lp = _run(x, **kw)
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok), (tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    return tok, lp


@pytest.mark.parametrize("tile", [1024, 256])
def test_full_tiles_read_once_and_match_twin(tile, monkeypatch):
    """The packed slot scan runs at R = 128 threads: 8 rows a thread at 1024-token tiles, 2
    at 256; a tie group straddling two rows of one thread and -inf lanes in the mix."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 4099, generator=g) * 3
    x[0, 100:140] = x[0].max() + 1.0          # 40 tied maxima: rows r and r + 1 of the tile
    x[1, 1500:2600] = float("-inf")           # one whole block and parts of two more
    ids = torch.randint(0, 4099, (3, 50), generator=g)
    reads = LogitReads(x, monkeypatch)
    kw = dict(tile=tile, temperature=0.7, top_k=torch.tensor([50, 3, 0]),
              top_p=torch.tensor([0.9, 1.0, 0.8]), repetition_penalty=1.2, input_ids=ids,
              seed=5, offset=torch.arange(3))
    _same_as_twin(x, **kw)
    assert reads.bytes == x.numel() * 4


def test_flagged_blocks_nan_inf_and_all_minus_inf():
    """A NaN makes its row invalid, +inf (and an x that overflows) takes the uniform limit
    over the maximal xp, an all -inf block contributes nothing; the other rows are untouched."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(5, 3000, generator=g) * 3
    x[0, 1234] = float("nan")
    x[1, [700, 2900]] = float("inf")
    x[2, :1024] = float("-inf")
    x[3, 2000] = 3e38                          # x = xp / 0.7 overflows to +inf
    x[4, 10] = -3e38                           # x overflows to -inf: not a finite token
    tok, lp = _same_as_twin(x, tile=1024, temperature=0.7, top_k=20, top_p=0.9, seed=3,
                            offset=torch.arange(5))
    assert tok[0] == -1 and tok[1] in (700, 2900) and tok[3] == 2000 and tok[4] != 10
    # five tokens with a finite x, the rest finite xp whose x is -inf: top-k 10 keeps the five
    y = torch.full((2, 3000), -3e38)
    y[:, [3, 1100, 1101, 2047, 2999]] = torch.tensor([0.5, 1.0, -2.0, 0.25, 3.0])
    _same_as_twin(y, tile=1024, temperature=0.7, top_k=10, top_p=torch.tensor([1.0, 0.6]),
                  seed=4, offset=torch.arange(2))


def test_every_finite_x_overflows():
    """T so small that every finite xp / T is +-inf: the row samples uniformly among its
    maximal xp (the numeric policy), found in one extra pass; an all -inf row is invalid."""
    x = -torch.rand(3, 2500) - 1.0            # all negative: x = xp / T -> -inf everywhere
    x[0, [5, 1800]] = -0.5                    # two maximal xp, far apart
    x[1, 2400] = 2.0                          # one positive xp: x -> +inf
    x[2] = float("-inf")
    tok, _ = _same_as_twin(x, tile=1024, temperature=1e-38, top_k=10, seed=1,
                           offset=torch.arange(3))
    assert tok[0] in (5, 1800) and tok[1] == 2400 and tok[2] == -1


def test_greedy_first_maximum_from_candidates_or_one_block(monkeypatch):
    """Greedy rows in a call that keeps every block's candidates (here: top-N logprobs) take
    the first maximal xp from the stored candidates when the block kept any (no extra read),
    else by re-reading that one block (> KT tied maxima, or +inf)."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(3, 3000, generator=g)
    x[0, [2100, 600, 2900]] = 9.0             # maxima in three blocks: the first is 600
    x[1, 768:1024] = 9.0                      # 256 tied maxima in one block, 64 slots
    x[2, [2500, 1700]] = float("inf")
    tok, lp, _, _ = _run(x, tile=256, cand=64, temperature=0.0, seed=0, top_n=2)
    assert tok.tolist() == [600, 768, 1700] and torch.equal(lp, torch.zeros(3))
    # row 0's maximum is a stored candidate: one read (rows 1 and 2 re-read a block, and
    # the top-N's own pass re-reads them whole: its raw candidates miss their maxima)
    reads = LogitReads(x, monkeypatch)
    assert _run(x[:1], tile=256, cand=64, temperature=0.0, top_n=2)[0].item() == 600
    assert reads.bytes == x.shape[1] * 4
    tw_tok, _ = _twin_tokens(x, temperature=0.0)
    assert torch.equal(tok, tw_tok)
    # with a penalty (not the twin's argmax shortcut) and a top-k that greedy ignores
    ids = torch.tensor([[600, 5, 6], [768, 7, 8], [1, 2, 3]])
    tok, lp, _, _ = _run(x, tile=256, cand=64, temperature=0.0, top_k=5,
                         repetition_penalty=1.5, input_ids=ids, top_n=2)
    tw_tok, tw_lp = _twin_tokens(x, temperature=0.0, top_k=5, repetition_penalty=1.5,
                                 input_ids=ids)
    assert torch.equal(tok, tw_tok) and torch.equal(lp, tw_lp)


def _greedy_rows():
    """Rows for the greedy-only launch: maxima in several blocks, a tie group straddling two
    blocks and filling one, +inf, NaN, -inf rows and blocks, +-3e38, an odd width."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(9, 3001, generator=g) * 3
    x[0, [2100, 600, 2900]] = 99.0            # the first of three blocks' maxima: 600
    x[1, 700:1100] = 99.0                     # ties across blocks 2-4 (tile 256): 700
    x[2, [2500, 1700]] = float("inf")         # the first +inf
    x[3, 1234] = float("nan")                 # invalid
    x[4] = float("-inf")                      # invalid
    x[5, :2990] = float("-inf")               # only the last, partial block is finite
    x[6, 5] = 3.0e38
    x[6, 3000] = 3.0e38                       # a finite maximum tied at the row's ends
    x[7, 1::2] = float("-inf")
    x[8] = torch.randint(-2, 2, (3001,), generator=g).float()   # tie-heavy everywhere
    return x


@pytest.mark.parametrize("tile,chunks,per_row", [(256, None, False), (1024, 2, True)])
def test_greedy_rows_read_once_first_maximum(tile, chunks, per_row, monkeypatch):
    """Greedy rows of a call asking only tokens and logprobs (every row: a scalar T = 0; or a
    tensor T's zeros) read each logit once and store each block's first maximal xp as its
    one candidate (kernels/stats.py _block_greedy): the tokens of torch.argmax, whatever the
    chunk count, equal to the candidates' path (the same call asking top-N logprobs) and to
    a tensor T's; NaN and all -inf rows invalid. Extra reads: the block of row 2's first
    +inf, and row 4's one pass for max xp (all -inf: the numeric policy's)."""
    x = _greedy_rows()
    T = torch.zeros(9) if per_row else 0.0
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=tile, chunks=chunks, temperature=T, seed=0)
    assert reads.bytes == x.numel() * 4 + tile * 4 + x.shape[1] * 4
    want = x.argmax(1)
    want[[3, 4]] = -1
    assert tok.tolist() == want.tolist()
    assert tok[0] == 600 and tok[1] == 700 and tok[2] == 1700 and tok[6] == 5
    assert torch.equal(lp, torch.where(want >= 0, 0.0, float("-inf")))
    # the other T form; the candidates' path (top-N asked: slow under the interpreter, once)
    other = dict(top_n=3) if per_row else dict(temperature=torch.zeros(9))
    ref = _run(x, tile=tile, chunks=chunks, seed=0, **dict(dict(temperature=T), **other))
    assert torch.equal(tok, ref[0]) and torch.equal(lp, ref[1])


def test_greedy_rows_among_sampling_rows():
    """A tensor T with greedy rows among top-k / top-p / min-p / pure rows: the greedy rows
    read as greedy blocks, the others as before (the twin's tokens and logprobs)."""
    x = _greedy_rows()[[0, 1, 2, 5, 6, 7, 8]]
    kw = dict(tile=256, temperature=torch.tensor([0.0, 0.7, 0.0, 1.0, 0.0, 0.8, 0.0]),
              top_k=torch.tensor([0, 20, 0, 0, 5, 0, 0]),
              top_p=torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 0.9, 1.0]),
              min_p=torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0]), seed=3,
              offset=torch.arange(7))
    tok, _ = _same_as_twin(x, **kw)
    assert tok[[0, 2, 4, 6]].tolist() == x.argmax(1)[[0, 2, 4, 6]].tolist()


def test_greedy_rows_penalties_match_twin():
    """Greedy blocks apply the repetition / presence / frequency penalties as the candidates'
    path does (with a top-k, which greedy ignores)."""
    x = _greedy_rows()[[0, 6, 8]]
    g = torch.Generator().manual_seed(15)
    ids = torch.cat([x.argmax(1, keepdim=True), torch.randint(0, 3001, (3, 30), generator=g)], 1)
    kw = dict(tile=256, top_k=5, repetition_penalty=1.5, frequency_penalty=0.3,
              presence_penalty=0.2, input_ids=ids, seed=0)
    tok, lp = _same_as_twin(x, temperature=0.0, **kw)
    for T in (torch.zeros(3), 0.0):  # greedy blocks; the candidates (top-N asked)
        ref = _run(x, temperature=T, top_n=0 if isinstance(T, torch.Tensor) else 2, **kw)
        assert torch.equal(tok, ref[0]) and torch.equal(lp, ref[1])
    assert (tok != x.argmax(1)).any()         # the penalty moved some row's maximum


def test_extreme_finite_values_keep_their_windows():
    """fl(m - x) overflows for finite +-3e38 logits: those lanes still count as finite."""
    x = torch.zeros(2, 2048)
    x[0, :1000] = -3.0e38
    x[0, 1500:1510] = 3.0e38
    x[1, ::2] = -3.4e38
    x[1, 1::2] = torch.linspace(-5, 5, 1024)
    _same_as_twin(x, tile=1024, temperature=1.0, top_k=torch.tensor([1200, 600]), seed=2,
                  offset=torch.arange(2))
