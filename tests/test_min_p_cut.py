"""Min-p's cut is x - M >= ln(min_p), both sides float32 values every backend shares (the log
once per row, params.log_cut): the kept set is the same bit for bit on the twin and the
kernels. The earlier test e^(x - M) >= min_p followed each backend's exp rounding: at min_p 1.0
a token 4.1e-8 below the max has float32 e^(x - M) = 0.99999994 in torch and 1.0 in numpy (the
interpreter), so the kernel kept two tokens where the twin kept one (found by fuzzing)."""
import math

import pytest
import torch

from gpu_sampler import sample, sampling_distribution
from gpu_sampler.params import log_cut

V = 67
BACKENDS = ("torch", "triton")


def _row(values):
    x = torch.full((V,), -30.0)
    x[:len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def _kept(backend, x, **kw):
    probs = sampling_distribution(x, backend=backend, **kw)
    return (probs > 0).nonzero()[:, 1].tolist() if x.shape[0] == 1 else probs > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_p_one_keeps_only_the_max_tie_group(backend):
    """min_p = 1.0 keeps x == M only: a token one rounding below the max is dropped."""
    x = _row([0.0, -4.0978193e-08, -5.9604645e-08, 0.0])[None, :]
    assert _kept(backend, x, temperature=1.0, min_p=1.0) == [0, 3]
    for seed in range(8):
        tok, lp = sample(x, temperature=1.0, min_p=1.0, seed=seed, backend=backend,
                         return_logprobs=True)
        assert int(tok) in (0, 3)
        torch.testing.assert_close(lp, torch.tensor([-math.log(2.0)]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("min_p", [0.1, 0.05, 0.9])
def test_cut_is_the_float32_log(backend, min_p):
    """x - M exactly at fl32(ln min_p) is kept, one float32 step below is dropped; per-row
    tensors follow the same rule."""
    lm = log_cut(min_p)
    below = torch.nextafter(torch.tensor(lm), torch.tensor(-math.inf)).item()
    x = _row([0.0, lm, below, lm / 2])[None, :]
    assert _kept(backend, x, temperature=1.0, min_p=min_p) == [0, 1, 3]
    xx = torch.stack([x[0], x[0].roll(5)])
    kept = _kept(backend, xx, temperature=1.0, min_p=torch.tensor([min_p, 1.0]))
    assert kept[0].nonzero()[:, 0].tolist() == [0, 1, 3]
    assert kept[1].nonzero()[:, 0].tolist() == [5]
