"""Inputs nobody chose: property-based tests, extreme values, poisoned outputs, memory, threads
and cross-process determinism for sample() / sampling_distribution().

Example counts are sized for the 10-minute suite; GPU_SAMPLER_SLOW=1 multiplies them by 10.
"""
import os
import resource
import subprocess
import sys
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpu_sampler
from conftest import BACKENDS, DEVICE, SLOW
from hf_reference import assert_matches_hf, assert_same_distribution

SCALE = 10 if SLOW else 1
NOT_SLOW = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def problems(draw, max_v, max_b=5):
    B = draw(st.integers(1, max_b))
    V = draw(st.integers(1, max_v))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    spread = draw(st.sampled_from([0.1, 1.0, 5.0, 30.0]))
    gen = torch.Generator().manual_seed(seed)
    style = draw(st.sampled_from(["normal", "ties", "neginf", "gumbel"]))
    if style == "normal":
        x = torch.randn(B, V, generator=gen) * spread
    elif style == "ties":
        x = torch.randint(0, 4, (B, V), generator=gen).float() * spread
    elif style == "gumbel":
        x = -torch.log(-torch.log(torch.rand(B, V, generator=gen).clamp(1e-7, 1 - 1e-7))) * spread
    else:
        x = torch.randn(B, V, generator=gen) * spread
        x[torch.rand(B, V, generator=gen) < 0.7] = float("-inf")
        x[torch.arange(B), torch.randint(0, V, (B,), generator=gen)] = 0.0
    x = x.to(dtype)

    def per_row(values):
        if draw(st.booleans()):
            return draw(st.sampled_from(values))
        return torch.tensor([draw(st.sampled_from(values)) for _ in range(B)])

    kw = dict(temperature=per_row([0.0, 0.3, 0.7, 1.0, 2.0]),
              top_k=per_row([0, 1, 2, 5, 50, V, V + 3]),
              top_p=per_row([0.0, 0.3, 0.9, 1.0]),
              min_p=per_row([0.0, 0.05, 0.5, 1.0]),
              repetition_penalty=per_row([1.0, 1.3, 0.8]))
    if isinstance(kw["top_k"], torch.Tensor):
        kw["top_k"] = kw["top_k"].to(torch.int64)
    ids = torch.randint(-1, V, (B, draw(st.integers(0, 12))), generator=gen)
    return x, kw, ids


def _dev(kw):
    return {n: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}


def _properties(backend, x, kw, ids):
    xd, idsd = x.to(DEVICE), ids.to(DEVICE)
    d = gpu_sampler.sampling_distribution(xd, input_ids=idsd, backend=backend, **_dev(kw)).cpu()
    assert not d.isnan().any()
    torch.testing.assert_close(d.sum(1), torch.ones(x.shape[0]), atol=1e-5, rtol=0)
    assert_matches_hf(d, x.float(), f"{backend}", input_ids=ids, **kw)
    tok = gpu_sampler.sample(xd, input_ids=idsd, backend=backend, seed=3,
                             offset=torch.arange(x.shape[0], device=DEVICE), **_dev(kw)).cpu()
    assert (d.gather(1, tok[:, None]) > 0).all(), "draw outside the support"
    T = kw["temperature"]
    greedy = (T == 0) if isinstance(T, torch.Tensor) else torch.full((x.shape[0],), T == 0)
    if greedy.any():
        pen = gpu_sampler.sampling_distribution(xd, input_ids=idsd, backend=backend,
                                                **_dev({**kw, "temperature": 0.0})).cpu()
        assert torch.equal(tok[greedy], pen.argmax(1)[greedy])


@settings(NOT_SLOW, max_examples=40 * SCALE)
@given(problems(max_v=5000))
def test_properties_torch(problem):
    _properties("torch", *problem)


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton cannot run here")
@settings(NOT_SLOW, max_examples=5 * SCALE)
@given(problems(max_v=300, max_b=3))
def test_properties_triton(problem):
    _properties("triton", *problem)


@pytest.mark.parametrize("V", [32000, 128256])
def test_properties_torch_large_vocab(V):
    gen = torch.Generator().manual_seed(V)
    x = torch.randn(3, V, generator=gen) * 4
    kw = dict(temperature=torch.tensor([0.0, 0.8, 1.2]), top_k=torch.tensor([0, 0, 40]),
              top_p=torch.tensor([1.0, 0.95, 0.8]), min_p=0.02, repetition_penalty=1.1)
    _properties("torch", x, kw, torch.randint(0, V, (3, 64), generator=gen))


EXTREMES = {
    "huge": torch.tensor([[1e30, -1e30, 0.0, 1e30, 5.0]]),
    "inf-mix": torch.tensor([[float("-inf"), 3.0, float("inf"), -2.0, float("inf")]]),
    "all-neginf-but-one": torch.tensor([[float("-inf")] * 4 + [-1e30]]),
    "subnormal": torch.tensor([[1e-40, -1e-42, 0.0, 1e-45, -0.0]]),
    "all-equal": torch.full((1, 5), 7.25),
    "max-float": torch.tensor([[3.4e38, 3.4e38, -3.4e38, 0.0, 1.0]]),
}
EXTREME_PARAMS = [dict(temperature=1e-6), dict(temperature=1e6), dict(repetition_penalty=1e-3),
                  dict(repetition_penalty=1e3), dict(top_k=2, top_p=0.5, temperature=0.01),
                  dict(min_p=1.0), dict(top_p=0.0), dict(temperature=0.0)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(EXTREMES))
def test_extreme_values(backend, name):
    """A finite distribution that both backends agree on, or the documented ValueError; never
    NaN probabilities, never a draw outside the support."""
    x = EXTREMES[name].to(DEVICE)
    ids = torch.arange(5).unsqueeze(0).to(DEVICE)  # every token of the vocabulary
    for kw in EXTREME_PARAMS:
        try:
            d = gpu_sampler.sampling_distribution(x, input_ids=ids, backend=backend, **kw).cpu()
        except ValueError as e:
            assert "no finite logit" in str(e) or "NaN" in str(e), e
            tok = gpu_sampler.sample(x, input_ids=ids, backend=backend, check=False, **kw)
            assert (tok == -1).all()
            continue
        assert not d.isnan().any(), (name, kw, d)
        torch.testing.assert_close(d.sum(1), torch.ones(1), atol=1e-5, rtol=0)
        twin = gpu_sampler.sampling_distribution(x.cpu(), input_ids=ids.cpu(), backend="torch",
                                                 **kw)
        assert_same_distribution(d, twin, f"{name} {kw}")
        for s in range(4):
            tok = gpu_sampler.sample(x, input_ids=ids, backend=backend, seed=s, **kw).cpu()
            assert d[0, tok[0]] > 0, (name, kw, tok)


# --- poisoned outputs -------------------------------------------------------------------------

GUARD = 64


@pytest.fixture
def poisoned(monkeypatch):
    """Kernel outputs come from a buffer full of NaN / 0x7F.. garbage with guard bands on both
    sides; after the call every output element must be written and every guard byte intact."""
    pytest.importorskip("triton")
    if "triton" not in BACKENDS:
        pytest.skip("triton cannot run here")
    from gpu_sampler.kernels import sampling as ks
    made = []

    def alloc(shape, dtype, device):
        n = 1
        for s in shape:
            n *= s
        buf = torch.empty(n + 2 * GUARD, dtype=dtype, device=device)
        if dtype.is_floating_point:
            buf.fill_(float("nan"))
        else:
            buf.fill_(0x7F7F7F7F7F7F7F7F if dtype == torch.int64 else 0x7F)
        made.append(buf)
        return buf[GUARD:GUARD + n].view(shape)

    monkeypatch.setattr(ks, "_alloc", alloc)
    yield made
    for buf in made:
        head, body, tail = buf[:GUARD], buf[GUARD:-GUARD], buf[-GUARD:]
        for band in (head, tail):
            if band.dtype.is_floating_point:
                assert band.isnan().all(), "a guard band was overwritten"
            else:
                assert (band == 0x7F7F7F7F7F7F7F7F).all(), "a guard band was overwritten"
        if body.dtype.is_floating_point:
            assert not body.isnan().any(), "an output element was left unwritten"
        else:
            assert (body != 0x7F7F7F7F7F7F7F7F).all(), "an output element was left unwritten"


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.0), dict(top_k=3, top_p=0.8),
                                dict(temperature=torch.tensor([0.0, 1.0, 0.5]), min_p=0.1)])
def test_poisoned_outputs(poisoned, kw):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 37, generator=gen).to(DEVICE)
    kw = _dev(kw)
    gpu_sampler.sample(x, backend="triton", seed=1, return_logprobs=True, **kw)
    gpu_sampler.sampling_distribution(x, backend="triton", **kw)
    bad = x.clone()
    bad[1, 3] = float("nan")
    gpu_sampler.sample(bad, backend="triton", check=False, seed=1, return_logprobs=True, **kw)
    gpu_sampler.sampling_distribution(bad, backend="triton", check=False, **kw)
    assert len(poisoned) == 6  # tokens + logprobs per sample, probs per distribution


# --- memory, threads, processes -------------------------------------------------------------

def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_no_memory_growth_over_10000_calls():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1000, generator=gen)
    ids = torch.randint(0, 1000, (4, 16), generator=gen)
    kw = dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1, input_ids=ids)
    for _ in range(500):  # warm up allocator caches
        gpu_sampler.sample(x, **kw)
    before = _rss_mb()
    for i in range(10_000):
        gpu_sampler.sample(x, seed=i, **kw)
    grown = _rss_mb() - before
    assert grown < 20, f"RSS grew by {grown:.1f} MiB over 10,000 calls"
    if torch.cuda.is_available():
        xc = x.cuda()
        gpu_sampler.sample(xc, temperature=0.7)
        m0 = torch.cuda.memory_allocated()
        for i in range(1000):
            gpu_sampler.sample(xc, seed=i, temperature=0.7)
        assert torch.cuda.memory_allocated() == m0


def _in_threads(fn, n):
    """fn(0..n-1) started together on n threads; their results, re-raising any failure."""
    got, errors = [None] * n, []

    def run(i):
        try:
            got[i] = fn(i)
        except Exception as e:  # pragma: no cover - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got


def test_threads_match_sequential():
    gen = torch.Generator().manual_seed(9)
    xs = [torch.randn(3, 2000, generator=gen) for _ in range(8)]
    kw = dict(temperature=0.8, top_k=30, top_p=0.9, backend="torch")
    expect = [gpu_sampler.sample(x, seed=i, offset=5, **kw) for i, x in enumerate(xs)]

    def work(i):
        for _ in range(20):
            out = gpu_sampler.sample(xs[i], seed=i, offset=5, **kw)
        return out

    got = _in_threads(work, 8)
    assert all(torch.equal(a, b) for a, b in zip(expect, got))


_CHILD = """
import torch, gpu_sampler
g = torch.Generator().manual_seed(1)
x = torch.randn(6, 3000, generator=g)
t = gpu_sampler.sample(x, temperature=0.9, top_k=40, top_p=0.95, seed=torch.arange(6) * 11,
                       offset=torch.arange(6))
print(",".join(map(str, t.tolist())))
"""


def test_same_seed_same_tokens_across_processes():
    outs = {subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "5"}).stdout}
    here = gpu_sampler.sample(torch.randn(6, 3000, generator=torch.Generator().manual_seed(1)),
                              temperature=0.9, top_k=40, top_p=0.95,
                              seed=torch.arange(6) * 11, offset=torch.arange(6))
    assert outs.pop().strip() == ",".join(map(str, here.tolist()))


# --- generate(): memory, threads, processes ---------------------------------------------------

def _gen_setup():
    from models import tiny_model
    model = tiny_model("llama", seed=0, vocab_size=300)
    ids = torch.randint(3, 300, (2, 6), generator=torch.Generator().manual_seed(0))
    return model, ids


def test_generate_no_memory_growth_over_200_calls():
    from gpu_sampler.hf.generation import generate
    model, ids = _gen_setup()
    kw = dict(max_new_tokens=2, min_new_tokens=2, do_sample=True, top_k=20, seed=1)
    for _ in range(20):
        generate(model, ids, **kw)
    before = _rss_mb()
    for _ in range(200):
        generate(model, ids, **kw)
    grown = _rss_mb() - before
    assert grown < 30, f"RSS grew by {grown:.1f} MiB over 200 generate() calls"


def test_generate_two_threads_match_sequential():
    from gpu_sampler.hf.generation import generate
    model, ids = _gen_setup()
    kws = [dict(max_new_tokens=8, do_sample=True, temperature=0.9, seed=s) for s in (5, 6)]
    expect = [generate(model, ids, **kw) for kw in kws]
    got = _in_threads(lambda i: generate(model, ids, **kws[i]), 2)
    assert all(torch.equal(a, b) for a, b in zip(expect, got))


_GEN_CHILD = """
import sys, torch
sys.path.insert(0, {tests!r})
from models import tiny_model
from gpu_sampler.hf.generation import generate
model = tiny_model("llama", seed=0, vocab_size=300)
ids = torch.randint(3, 300, (2, 6), generator=torch.Generator().manual_seed(0))
out = generate(model, ids, max_new_tokens=8, do_sample=True, top_p=0.9, seed=77)
print(",".join(map(str, out.flatten().tolist())))
"""


def test_generate_same_seed_across_processes():
    from gpu_sampler.hf.generation import generate
    code = _GEN_CHILD.format(tests=os.path.dirname(__file__))
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "7"}).stdout
    model, ids = _gen_setup()
    here = generate(model, ids, max_new_tokens=8, do_sample=True, top_p=0.9, seed=77)
    assert child.strip() == ",".join(map(str, here.flatten().tolist()))
