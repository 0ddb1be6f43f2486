"""Public-layer checks a fuzzer of the ops found missing: each bad value raises ValueError naming
the parameter, the same on both backends, where it raised an unrelated exception on one backend
or was read past a tensor's end on the other."""
import pytest
import torch

import gpu_sampler
from gpu_sampler import Sampler, SamplingSlots
from gpu_sampler.beam import beam_topk
from gpu_sampler.speculative import speculative_sample

N, V = 3, 40
BACKENDS = ("torch", "triton")


def _x(seed=0, B=N):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", BACKENDS)
def test_history_ids_past_the_vocabulary_are_padding_with_check_false(backend):
    """check=False lets ids >= V through: both backends skip them as padding (the twin raised
    an out-of-bounds RuntimeError)."""
    x = _x()[:2]
    kw = dict(repetition_penalty=1.5, frequency_penalty=0.5, check=False, seed=1,
              return_logprobs=True, backend=backend)
    padded = gpu_sampler.sample(x, input_ids=torch.tensor([[3, -1, 7], [1, 2, -1]]), **kw)
    past = gpu_sampler.sample(x, input_ids=torch.tensor([[3, V, 7], [1, 2, V + 5]]), **kw)
    assert torch.equal(past[0], padded[0]) and torch.equal(past[1], padded[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw, name", [
    (dict(seed=torch.tensor([1, 2])), "seed"),
    (dict(seed=torch.tensor([1.0, 2.0, 3.0])), "seed"),
    (dict(input_ids=torch.zeros(2, 4, dtype=torch.long), repetition_penalty=1.3), "input_ids"),
    (dict(input_ids=torch.zeros(N, 4), repetition_penalty=1.3), "input_ids"),
    (dict(input_ids=torch.full((N, 4), V), repetition_penalty=1.3), "input_ids"),
    (dict(candidates=torch.zeros(N, V, dtype=torch.long)), "candidates"),
    (dict(normalize="yes"), "normalize"),
])
def test_beam_topk_refuses_bad_arguments(backend, kw, name):
    with pytest.raises(ValueError, match=name):
        beam_topk(_x(), 3, backend=backend, **kw)


def test_beam_topk_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        beam_topk(_x(), 3, backend="bogus")


@pytest.mark.parametrize("args, kw, name", [
    ((-1, 100), {}, "max_batch"), ((2.5, 100), {}, "max_batch"), ((4, 0), {}, "vocab"),
    ((4, 100), dict(dtype=torch.int64), "dtype")])
def test_sampler_checks_its_construction(args, kw, name):
    with pytest.raises(ValueError, match=name):
        Sampler(*args, **kw)


@pytest.mark.parametrize("kw", [dict(temperature=0.5), dict(seed=3)])
def test_sampler_call_refuses_per_request_values(kw):
    """Per-request values live in the slots; passing one to the call was a TypeError."""
    with pytest.raises(ValueError, match=next(iter(kw))):
        Sampler(2, 10)(torch.randn(2, 10), SamplingSlots(2), **kw)


def test_speculative_errors_name_target_logits():
    bad = torch.zeros(2, 4, 10, dtype=torch.float64)
    with pytest.raises(ValueError, match="target_logits"):
        speculative_sample(bad, torch.zeros(2, 3, dtype=torch.long), None)


@pytest.mark.parametrize("allowed", [torch.ones(1, 3), torch.ones(3, dtype=torch.bool),
                                     [[True, False]], torch.tensor([[2, 0, 0]])])
def test_pack_mask_takes_a_bool_matrix_only(allowed):
    """An int mask [[2, 0, 0]] allowed token 1 instead of token 0."""
    with pytest.raises(ValueError, match="allowed"):
        gpu_sampler.pack_mask(allowed)
