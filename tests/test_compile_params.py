"""sample() / speculative_sample() / generate() under torch.compile: the cases a CPU fuzz of
the compiled paths against eager found (eager / aot_eager backends: fast)."""
import warnings

import pytest
import torch

import gpu_sampler
from tests.models import tiny_model


def _compiled(fn, **kw):
    torch._dynamo.reset()
    return torch.compile(fn, backend="eager", **kw)


@pytest.mark.parametrize("seed,offset", [(2**63 + 7, 3), (2**64 - 1, 0), (5, 2**63 + 1)])
def test_compiled_seed_and_offset_take_the_64_bit_range(seed, offset):
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    f = _compiled(lambda l, s, o: gpu_sampler.sample(l, seed=s, offset=o, return_logprobs=True),
                  fullgraph=True)
    e, c = gpu_sampler.sample(x, seed=seed, offset=offset, return_logprobs=True), f(x, seed, offset)
    assert torch.equal(e[0], c[0]) and torch.equal(e[1], c[1])
    s = gpu_sampler.speculative_sample(x[:, None].expand(3, 2, 50).contiguous(),
                                       torch.zeros(3, 1, dtype=torch.long), seed=seed)
    g = _compiled(lambda t, d: gpu_sampler.speculative_sample(t, d, seed=seed), fullgraph=True)
    assert all(torch.equal(a, b) for a, b in zip(s, g(x[:, None].expand(3, 2, 50).contiguous(),
                                                       torch.zeros(3, 1, dtype=torch.long))))


def test_compiled_seedless_sample_survives_a_dynamic_batch():
    """No seed: per-row seeds are drawn inside the graph; a batch size change (automatic
    dynamic shapes) or dynamic=True must not break the trace."""
    for dynamic in (None, True):
        f = _compiled(lambda l: gpu_sampler.sample(l, top_k=5), fullgraph=True, dynamic=dynamic)
        for B in (2, 3, 5):
            tok = f(torch.randn(B, 40))
            assert tok.shape == (B,) and bool((tok >= 0).all())


def test_compiled_temperature_rounding_to_zero_is_an_invalid_row_as_in_eager():
    x = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([1e-50, 1.0], dtype=torch.float64)
    f = _compiled(lambda l, t: gpu_sampler.sample(l, temperature=t, seed=1, return_logprobs=True),
                  fullgraph=True)
    e = gpu_sampler.sample(x, temperature=t, seed=1, return_logprobs=True, check=False)
    c = f(x, t)
    assert e[0].tolist()[0] == -1 and torch.equal(e[0], c[0]) and torch.equal(e[1], c[1])
    g = _compiled(lambda l: gpu_sampler.sample(l, temperature=1e-50, seed=1))
    assert g(x).tolist() == [-1, -1]  # eager refuses it; compiled: check=False semantics


def test_compiled_call_refuses_what_eager_refuses_whatever_check():
    x = torch.randn(2, 50)
    with pytest.raises(ValueError, match="needs seed"):
        _compiled(lambda l: gpu_sampler.sample(l, offset=5))(x)
    with pytest.raises(ValueError, match="floating-point"):
        _compiled(lambda l: gpu_sampler.sample(l, temperature=torch.tensor([1, 0]), seed=1))(x)
    with pytest.raises(ValueError, match="top_k"):
        _compiled(lambda l: gpu_sampler.sample(l, top_k=True, seed=1))(x)


def test_generate_and_patch_take_a_torch_compiled_module():
    """transformers' ``torch.compile(model).generate`` is the module's own generate; so are
    gpu_sampler.generate(compiled) and patch(compiled).generate."""
    model = tiny_model("llama", seed=0, vocab_size=97)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    cm = torch.compile(model, backend="eager")
    ref = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(gpu_sampler.generate(cm, ids, max_new_tokens=4, do_sample=False), ref)
    assert gpu_sampler.patch(cm, fallback=False) is cm
    assert torch.equal(cm.generate(ids, max_new_tokens=4, do_sample=False), ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cm.generate(ids, max_new_tokens=4, do_sample=True, seed=0).shape == (2, 7)
    assert gpu_sampler.unpatch(cm) is cm and "generate" not in model.__dict__


def test_refused_arguments_graph_break_to_the_eager_call_without_fullgraph():
    """top_logprobs / masks / generator are refused by the traced op; without fullgraph the call
    graph-breaks and sample() runs eagerly inside the compiled region, where dynamo must not
    trace the twin's numpy RNG (it failed: "rshift_cpu" not implemented for 'UInt32')."""
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(2))
    mask = gpu_sampler.pack_mask(torch.arange(70)[None].expand(3, 70) % 3 != 0)
    for kw in (dict(top_logprobs=3, seed=2), dict(allowed_mask=mask, seed=4)):
        out = _compiled(lambda l: gpu_sampler.sample(l, **kw))(x)
        ref = gpu_sampler.sample(x, **kw)
        out, ref = (out if isinstance(out, tuple) else (out,)), (ref if isinstance(ref, tuple) else (ref,))
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
    with pytest.raises(Exception, match="top_logprobs"):
        _compiled(lambda l: gpu_sampler.sample(l, top_logprobs=3, seed=2), fullgraph=True)(x)
