"""The draw has no probability floor: a kept token far below the max is drawn at its own rate,
not at ~2^-24 per draw. In float32 the top hash value a = 2^24 - 1 made u = fl(a + 1/2) 2^-24 =
1.0 and G = +inf, a forced winner (gpu_sampler/rng.py: u is now at most 1 - 2^-24)."""
import numpy as np
import torch

import gpu_sampler as gs
from gpu_sampler import rng


def _top_hash_ids(seed, V):
    """Token ids < V whose hash bits are 2^24 - 1 under (seed, offset 0)."""
    lo, hi = rng.row_keys(torch.tensor([seed]), torch.tensor([0]))
    ids = np.arange(V, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h = rng._np_fmix32(rng._np_fmix32((ids * np.uint32(0x9E3779B1)) ^ np.uint32(lo.item()))
                           ^ np.uint32(hi.item()))
    return torch.from_numpy(np.flatnonzero((h >> np.uint32(8)) == 2 ** 24 - 1))


def test_top_hash_value_gives_finite_noise_on_every_path():
    seed = next(s for s in range(100000) if len(_top_hash_ids(s, 20000)))
    ids = _top_hash_ids(seed, 20000)[:1]
    lo, hi = rng.row_keys(torch.tensor([seed]), torch.tensor([0]))
    torch_path = rng.gumbel(lo, hi, ids[None])  # the path of non-CPU tensors
    few = rng.gumbel_rows(seed, 0, ids[None])  # <= 16 rows: Python-int keys
    many = rng.gumbel_rows(seed, 0, ids[None].expand(17, 1).contiguous())  # numpy keys
    assert torch.isfinite(torch_path).all()
    assert torch.equal(torch_path, few) and torch.equal(many, few.expand(17, 1))
    assert float(rng.uniform(lo, hi, ids[None])) == rng.U_MAX


def test_confident_row_has_no_floor():
    """x = [0, -30, ..., -30], V = 4000: P(token != 0) = 3999 e^-30 ~ 4e-10 a draw. Over 20000
    draws the 2^-24 floor gave ~4.8 expected off-top draws (3 at this seed); now none."""
    V, N = 4000, 20000
    x = torch.full((1, V), -30.0)
    x[0, 0] = 0.0
    tok = gs.sample(x.expand(N, V).contiguous(), seed=99, offset=torch.arange(N), backend="torch")
    assert int((tok != 0).sum()) == 0
