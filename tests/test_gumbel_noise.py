"""The draw's Gumbel noise has neither a floor nor a cut tail (gpu_sampler/rng.py).

Floor (twenty-fifth session): fl(a + 1/2) 2^-24 = 1.0 at a = 2^24 - 1 gave G = +inf, a token that
won every draw it was kept in. Tail (twenty-sixth): u from 24 bits capped G at 16.64, so tokens
of processed probability below ~3e-7 were under-drawn (0.51x at 4e-8). G is now drawn through
w = 1 - u from all 32 hash bits: P(G >= g) = 1 - exp(-e^-g) to one hash value up to g = 22.8."""
import math

import numpy as np
import pytest
import torch
from conftest import BACKENDS, DEVICE

import gpu_sampler as gs
from gpu_sampler import rng


def _hashes(seed, V):
    lo, hi = rng.row_keys(torch.tensor([seed]), torch.tensor([0]))
    return rng.hash_np(lo.item(), hi.item(), np.arange(V, dtype=np.uint32))


def test_upper_tail_counts_are_exact():
    """G is decreasing in h; the number of hash values with G >= g is 2^32 P(G >= g) to +-1 for
    g = 12 .. 22 (the old noise had none above 16.64 and too few above ~15)."""
    h = torch.arange(1 << 20, dtype=torch.int64)
    g = rng.gumbel_of_hash(h)
    assert bool((g[1:] <= g[:-1]).all())
    for t in (12.0, 14.0, 16.0, 16.64, 17.0, 18.0, 20.0, 22.0):
        n = int((g >= t).sum())
        want = 2.0 ** 32 * -math.expm1(-math.exp(-t))
        assert abs(n - want) <= 1 + 1e-4 * want, (t, n, want)
    assert float(g.max()) > 22.8


def test_every_path_gives_the_same_finite_noise():
    """The torch path (non-CPU tensors), the Python-key path (<= 16 rows) and the numpy path
    agree bit for bit, the top hash values (fl(h) = 2^32, w clamped) included, and every value
    is finite."""
    seed = next(s for s in range(100000) if (_hashes(s, 20000) >= 2 ** 32 - 128).any())
    top = torch.from_numpy(np.flatnonzero(_hashes(seed, 20000) >= 2 ** 32 - 128))[:1]
    ids = torch.cat([top, torch.arange(4096)])[None]
    lo, hi = rng.row_keys(torch.tensor([seed]), torch.tensor([0]))
    torch_path = rng.gumbel(lo, hi, ids)
    few = rng.gumbel_rows(seed, 0, ids)
    many = rng.gumbel_rows(seed, 0, ids.expand(17, -1).contiguous())
    assert torch.isfinite(torch_path).all() and float(torch_path[0, 0]) > -2.9
    assert torch.equal(torch_path, few) and torch.equal(many, few.expand(17, -1))


def _pair_chi2_p(a, b):
    """p-value of a chi-square test of independence on 4-bit values a, b (16 x 16 cells, uniform
    margins: every hash value is equally likely)."""
    from scipy.stats import chi2
    c = np.bincount((a.astype(np.int64) * 16 + b).ravel(), minlength=256).astype(np.float64)
    e = c.sum() / 256
    return chi2.sf(((c - e) ** 2 / e).sum(), 255)


def test_hash_pairs_look_independent():
    """A row's hashes are a bijection of the id, and a token's hash tells nothing about another
    token's or another key's (the draw's noise must be iid): 512 keys x 2^13 ids a test, the top
    and the low 4 bits of h_i against h_(i+d) (d 1, 2, 3, 16, 256), and the same id under keys
    one bit apart (either half). A mixer that skipped a round fails these (p < 1e-30)."""
    g = np.random.default_rng(33)
    k = g.integers(0, 2 ** 32, (2, 512, 1), dtype=np.uint64).astype(np.uint32)
    ids = g.integers(0, 2 ** 17, (512, 1), dtype=np.uint64).astype(np.uint32) + np.arange(
        1 << 13, dtype=np.uint32)
    h = rng.hash_np(k[0], k[1], ids)
    assert np.unique(rng.hash_np(k[0, 0], k[1, 0], np.arange(1 << 18))).size == 1 << 18
    ps = {}
    for d in (1, 2, 3, 16, 256):
        ps[f"top{d}"] = _pair_chi2_p(h[:, :-d] >> 28, h[:, d:] >> 28)
        ps[f"low{d}"] = _pair_chi2_p(h[:, :-d] & 15, h[:, d:] & 15)
    bit = (np.uint32(1) << g.integers(0, 32, (512, 1)).astype(np.uint32))
    ps["key_lo"] = _pair_chi2_p(h >> 28, rng.hash_np(k[0] ^ bit, k[1], ids) >> 28)
    ps["key_hi"] = _pair_chi2_p(h >> 28, rng.hash_np(k[0], k[1] ^ bit, ids) >> 28)
    assert min(ps.values()) > 1e-4, ps


def test_acceptance_uniform_holds_its_rate_near_zero():
    """rng.uniform, speculative_sample's acceptance uniform (accept when u q < p): the number of
    hash values with u < r is r 2^32 to +-1 for r = 1e-9 .. 1e-3 (from 24 bits u >= 2^-25: a
    draft with p / q < 2^-25 was never accepted), and the top hash values stay below 1."""
    u = rng.uniform_of_hash(torch.arange(1 << 24, dtype=torch.int64))
    for r in (1e-9, 1e-8, 1e-7, 1e-5, 1e-3):
        n = int((u * 1.0 < torch.tensor(r, dtype=torch.float32)).sum())
        assert abs(n - r * 2.0 ** 32) <= 1 + 1e-6 * r * 2.0 ** 32, (r, n)
    seed = next(s for s in range(100000) if (_hashes(s, 20000) >= 2 ** 32 - 128).any())
    ids = torch.from_numpy(np.flatnonzero(_hashes(seed, 20000) >= 2 ** 32 - 128))[:1]
    lo, hi = rng.row_keys(torch.tensor([seed]), torch.tensor([0]))
    assert float(rng.uniform(lo, hi, ids[None])) == rng.U_MAX


def test_confident_row_has_no_floor():
    """x = [0, -30, ..., -30], V = 4000: P(token != 0) = 3999 e^-30 ~ 4e-10 a draw. Over 20000
    draws the 2^-24 floor gave ~4.8 expected off-top draws (3 at this seed); now none."""
    V, N = 4000, 20000
    x = torch.full((1, V), -30.0)
    x[0, 0] = 0.0
    tok = gs.sample(x.expand(N, V).contiguous(), seed=99, offset=torch.arange(N), backend="torch")
    assert int((tok != 0).sum()) == 0


def _far_tail_case(V=4096):
    """(seed, j, i): under (seed, offset 0) token j's hash is below 2^6 (G >= 18.0, beyond the
    old noise's 16.64) and token i's noise is in (-1.9, -1.5)."""
    for seed in range(1 << 17):
        h = _hashes(seed, V)
        js = np.flatnonzero(h < 64)
        if len(js):
            g = rng.gumbel_of_hash(torch.from_numpy(h.astype(np.int64)))
            i = int(torch.nonzero((g > -1.9) & (g < -1.5))[0])
            return seed, int(js[0]), i
    raise AssertionError("no seed found")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw", [{}, {"min_p": 1e-9}], ids=["pure-T", "min-p"])
def test_far_tail_token_wins_its_draw(backend, kw):
    """Row [0 at i, -19 at j, -inf elsewhere]: j has probability 5.6e-9 and must win exactly
    when -19 + G_j > G_i, which holds here (G_j >= 18.0 > 17.5 = G_i + 19). With G capped at
    16.64 it never could (-2.36 < G_i): the draw then under-drew every token below ~3e-7."""
    V = 4096
    seed, j, i = _far_tail_case(V)
    x = torch.full((1, V), float("-inf"), device=DEVICE)
    x[0, i], x[0, j] = 0.0, -19.0
    tok = gs.sample(x, seed=seed, offset=0, backend=backend, **kw)
    assert int(tok) == j
