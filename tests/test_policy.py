"""The numeric policy for sampler parameters (docs/reliability.md), on both backends.

Per-row non-finite values, values float32 cannot hold, tiny top_p, x = xp / T overflowing,
top_k beyond V, 64-bit seeds, float64 logits and bad generators; the kernel (under the Triton
interpreter here, so V and B stay tiny) and the torch twin draw the same tokens.
"""
import math

import pytest
import torch

import gpu_sampler
from conftest import BACKENDS, DEVICE

INF, NAN = float("inf"), float("nan")
U64 = 2 ** 64
X_TIE = torch.tensor([[1.0, 3.0, 3.0, 2.5, -1.0, 0.0, 3.0]])  # max 3.0 at {1, 2, 6}
V = X_TIE.shape[1]
needs_triton = pytest.mark.skipif("triton" not in BACKENDS, reason="triton cannot run here")


def _d(v):
    return v.to(DEVICE) if isinstance(v, torch.Tensor) else v


def _dev(kw):
    return {n: _d(v) for n, v in kw.items()}


def _uniform_on(support, n=V):
    p = torch.zeros(1, n)
    p[0, sorted(support)] = 1.0 / len(support)
    return p


def _seeded(backend, x, kw, n=4):
    """n draws of the same row in one launch (offset = row): tokens and logprobs."""
    xs = x.expand(n, x.shape[1]).contiguous()
    kw = {k: (v.expand(n).contiguous() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
          for k, v in kw.items()}
    if isinstance(kw.get("input_ids"), torch.Tensor):
        kw["input_ids"] = kw["input_ids"].expand(n, -1).contiguous()
    tok, lp = gpu_sampler.sample(_d(xs), seed=11, offset=_d(torch.arange(n)), backend=backend,
                                 return_logprobs=True, **_dev(kw))
    return tok.cpu(), lp.cpu()


# --- per-row values the math cannot take: invalid row (check=False) or ValueError -------------

PER_ROW = [  # (parameter, bad value, dtype, a good value for the other row)
    ("temperature", INF, torch.float32, 0.7),
    ("temperature", NAN, torch.float32, 0.7),
    ("temperature", 1e-50, torch.float64, 0.7),  # positive, 0 in float32
    ("repetition_penalty", INF, torch.float32, 1.3),
    ("repetition_penalty", 1e-50, torch.float64, 1.3),
    ("presence_penalty", INF, torch.float32, 0.5),
    ("presence_penalty", -INF, torch.float32, 0.5),  # would force the penalised token
    ("frequency_penalty", INF, torch.float32, 0.5),
    ("frequency_penalty", -INF, torch.float32, 0.5),
    ("frequency_penalty", 1e300, torch.float64, 0.5),  # inf in float32
    ("top_p", NAN, torch.float32, 0.9),
    ("min_p", INF, torch.float32, 0.1),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,bad,dtype,good", PER_ROW,
                         ids=[f"{c[0]}={c[1]}-{str(c[2])[6:]}" for c in PER_ROW])
def test_per_row_bad_value_invalidates_only_its_row(backend, name, bad, dtype, good):
    x = torch.randn(2, V, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[1, 1, 2, 5], [1, 1, 2, 5]])
    kw = dict(input_ids=ids, top_k=5, **{name: torch.tensor([bad, good], dtype=dtype)})
    tok, lp = gpu_sampler.sample(_d(x), seed=3, check=False, return_logprobs=True,
                                 backend=backend, **_dev(kw))
    d = gpu_sampler.sampling_distribution(_d(x), check=False, backend=backend, **_dev(kw)).cpu()
    assert tok[0] == -1 and lp[0] == -INF and (d[0] == 0).all()
    # The good row is what it is alone, with its value as a scalar.
    one = dict(input_ids=ids[1:], top_k=5, **{name: good})
    t1, lp1 = gpu_sampler.sample(_d(x[1:]), seed=3, return_logprobs=True, backend=backend,
                                 **_dev(one))
    assert tok[1] == t1[0] and lp[1] == lp1[0]
    assert torch.equal(d[1:], gpu_sampler.sampling_distribution(_d(x[1:]), backend=backend,
                                                                **_dev(one)).cpu())
    with pytest.raises(ValueError, match=f"{name} has an invalid value .* at row 0"):
        gpu_sampler.sample(_d(x), backend=backend, **_dev(kw))
    with pytest.raises(ValueError, match=name):
        gpu_sampler.sampling_distribution(_d(x), backend=backend, **_dev(kw))


SCALAR_REFUSED = [
    ("presence_penalty", 1e300, "not finite in float32"),
    ("presence_penalty", -1e39, "not finite in float32"),
    ("frequency_penalty", 1e300, "not finite in float32"),
    ("frequency_penalty", INF, "invalid value"),
    ("temperature", 1e-50, "rounds to 0 in float32"),
    ("temperature", 1e39, "not finite in float32"),
    ("temperature", INF, "invalid value"),
    ("repetition_penalty", 1e-50, "rounds to 0 in float32"),
    ("repetition_penalty", 10 ** 400, "not finite in float32"),  # beyond float64 too
    ("top_p", NAN, "invalid value"),
    ("top_k", -1, "invalid value"),
    ("top_k", INF, "must be an integer"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,value,why", SCALAR_REFUSED,
                         ids=[f"{c[0]}={str(c[1])[:8]}" for c in SCALAR_REFUSED])
def test_scalar_float32_cannot_hold_is_refused(backend, name, value, why):
    with pytest.raises(ValueError, match=f"{name}.*{why}"):
        gpu_sampler.sample(_d(X_TIE), backend=backend, **{name: value})
    with pytest.raises(ValueError, match=f"{name}.*{why}"):
        gpu_sampler.sampling_distribution(_d(X_TIE), backend=backend, **{name: value})


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalars_are_rounded_to_float32(backend):
    """Both backends see the float32 value: 1 - 1e-9 is top_p 1 (off), 1e-46 is min_p 0 (off),
    and a temperature equal in float32 gives the same distribution."""
    x = _d(torch.randn(1, V, generator=torch.Generator().manual_seed(2)))
    base = gpu_sampler.sampling_distribution(x, temperature=0.7, backend=backend)
    for kw in (dict(top_p=1 - 1e-9), dict(min_p=1e-46), dict(temperature=0.7 + 1e-12)):
        d = gpu_sampler.sampling_distribution(x, backend=backend, **{"temperature": 0.7, **kw})
        assert torch.equal(d, base), kw


# --- tiny top_p -------------------------------------------------------------------------------

TINY_P = [1e-46, 1e-45, 0.0, torch.tensor([1e-46], dtype=torch.float64),
          torch.tensor([1e-45])]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("top_p", TINY_P, ids=["1e-46", "1e-45", "0", "t64-1e-46", "t32-1e-45"])
def test_tiny_top_p_keeps_the_max_tie_group(backend, top_p):
    kw = dict(temperature=0.7, top_p=top_p)
    d = gpu_sampler.sampling_distribution(_d(X_TIE), backend=backend, **_dev(kw)).cpu()
    assert torch.equal(d, _uniform_on({1, 2, 6}))
    tok, lp = _seeded(backend, X_TIE, kw)
    assert set(tok.tolist()) <= {1, 2, 6}
    torch.testing.assert_close(lp, torch.full((4,), math.log(1 / 3)))


# --- overflow of x = xp / T: the argmax tie group of xp ----------------------------------------

OVERFLOW = [  # (id, logits, kwargs, the kept set)
    # 2.9e9 / 1e-30 overflows too, but is not in the argmax tie group.
    ("T1e-30", [[1e9, 3e9, 3e9, 2.9e9, -1.0, 0.0, 3e9]], dict(temperature=1e-30), {1, 2, 6}),
    ("T1e-45-subnormal", X_TIE.tolist(), dict(temperature=1e-45), {1, 2, 6}),
    # Every x is -inf (negative overflow): still the argmax, never "no finite logit left".
    ("T1e-30-negative", [[-1e9, -3e9, -1e9, -2e9, -1e9 - 1e3, -5e9, -4e9]],
     dict(temperature=1e-30), {0, 2}),
    ("T-tensor", [[1e9, 3e9, 3e9, 2.9e9, -1.0, 0.0, 3e9]],
     dict(temperature=torch.tensor([1e-30])), {1, 2, 6}),
    # Tiny repetition penalty: 3 / 1e-38 = 3e38, then / T = 0.5 overflows; 1 / 1e-38 does not.
    ("rep1e-38", X_TIE.tolist(),
     dict(repetition_penalty=1e-38, temperature=0.5, input_ids=torch.tensor([[0, 1, 2, 6]])),
     {1, 2, 6}),
    ("posinf-topk-topp", [[INF, 1.0, INF, 2.0, -INF, 0.0, 3.0]],
     dict(temperature=0.9, top_k=1, top_p=0.1), {0, 2}),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", OVERFLOW, ids=[c[0] for c in OVERFLOW])
def test_overflow_keeps_the_argmax_tie_group(backend, case):
    _, logits, kw, kept = case
    x = torch.tensor(logits)
    d = gpu_sampler.sampling_distribution(_d(x), backend=backend, **_dev(kw)).cpu()
    assert torch.equal(d, _uniform_on(kept))
    tok, lp = _seeded(backend, x, kw)
    assert set(tok.tolist()) <= kept
    torch.testing.assert_close(lp, torch.full((4,), -math.log(len(kept))))


# --- top_k beyond the vocabulary ---------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [V, V + 1, 2 ** 63, 2 ** 100, torch.tensor([2 ** 63 - 1]),
                               torch.tensor([2 ** 62])],
                         ids=["V", "V+1", "2**63", "2**100", "t-2**63-1", "t-2**62"])
def test_top_k_at_least_V_keeps_all(backend, k):
    x = torch.randn(1, V, generator=torch.Generator().manual_seed(4))
    off = gpu_sampler.sampling_distribution(_d(x), top_k=0, backend=backend).cpu()
    d = gpu_sampler.sampling_distribution(_d(x), top_k=_d(k), backend=backend).cpu()
    assert torch.equal(d, off) and (d > 0).all()
    t_off = gpu_sampler.sample(_d(x), top_k=0, seed=5, backend=backend)
    assert torch.equal(gpu_sampler.sample(_d(x), top_k=_d(k), seed=5, backend=backend), t_off)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_logits_refused(backend):
    x = X_TIE.double().to(DEVICE)
    with pytest.raises(ValueError, match="logits .*float64"):
        gpu_sampler.sample(x, backend=backend)
    with pytest.raises(ValueError, match="logits .*float64"):
        gpu_sampler.sampling_distribution(x, backend=backend)


# --- seeds and offsets: 64 bits, s and s - 2**64 are one stream -------------------------------

def _seed_draws(backend, B, **kw):
    x = torch.zeros(B, 16)  # uniform: the token is the stream's argmax Gumbel
    return gpu_sampler.sample(_d(x), backend=backend, **_dev(kw)).cpu()


# The twin's rng takes Python ints up to 16 rows and numpy beyond; the kernel has one path, so
# its 17-row case (slow under the interpreter) checks one seed.
SEED_B = [("torch", 1), ("torch", 20)] + ([("triton", 1), ("triton", 17)]
                                          if "triton" in BACKENDS else [])


@pytest.mark.parametrize("backend,B", SEED_B)
def test_seed_and_offset_wrap_at_2_64(backend, B):
    offs = torch.arange(B) * 3
    for s in (U64 - 1,) if B > 16 and backend == "triton" else (2 ** 63, U64 - 1, 2 ** 63 + 9):
        a = _seed_draws(backend, B, seed=s, offset=offs)
        assert torch.equal(a, _seed_draws(backend, B, seed=s - U64, offset=offs)), s
    if B > 16 and backend == "triton":
        return
    # Extreme seeds in a per-row tensor and a wrapped scalar offset.
    seeds = torch.tensor([-2 ** 63, 2 ** 63 - 1, -1, 0] * 5)[:B]
    a = _seed_draws(backend, B, seed=seeds, offset=U64 - 7)
    assert torch.equal(a, _seed_draws(backend, B, seed=seeds, offset=-7))
    # Different 64-bit seeds are different streams (not truncated to 63 or 32 bits).
    x = torch.zeros(1, 1000)
    draws = {int(gpu_sampler.sample(_d(x), seed=s, backend=backend)[0])
             for s in (0, 2 ** 32, 2 ** 63, -2 ** 63 + 1)}
    assert len(draws) > 1


@pytest.mark.parametrize("kw,name", [(dict(seed=U64), "seed"), (dict(seed=-2 ** 63 - 1), "seed"),
                                     (dict(seed=1.0), "seed"), (dict(seed=0, offset=U64), "offset"),
                                     (dict(seed=0, offset=-2 ** 63 - 1), "offset")])
def test_seed_outside_64_bits_refused(kw, name):
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=name):
            gpu_sampler.sample(_d(X_TIE), backend=backend, **kw)


def test_generator_must_be_a_generator_on_the_logits_device():
    x = torch.zeros(2, 5)
    for bad in (0, "cpu", torch.tensor(1)):
        with pytest.raises(ValueError, match="generator"):
            gpu_sampler.sample(x, generator=bad)
    with pytest.raises(ValueError, match="generator is on cpu"):
        gpu_sampler.sample(torch.zeros(2, 5, device="meta"), generator=torch.Generator())
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="generator"):
            gpu_sampler.sample(x.cuda(), generator=torch.Generator())
    g = torch.Generator().manual_seed(0)
    assert gpu_sampler.sample(x, generator=g).shape == (2,)


# --- the same tokens on both backends ----------------------------------------------------------

AGREE = [  # (id, logits [1, V], kwargs): each drawn at 5 offsets on both backends
    ("overflow", [[1e9, 3e9, 3e9, 2.9e9, -1.0, 0.0, 3e9]], dict(temperature=1e-30)),
    ("overflow-negative", [[-1e9, -3e9, -1e9, -2e9, -1e9 - 1e3, -5e9, -4e9]],
     dict(temperature=1e-30)),
    ("rep-tiny", X_TIE.tolist(),
     dict(repetition_penalty=1e-38, temperature=0.5, input_ids=torch.tensor([[0, 1, 2, 6]]))),
    ("top_p-tiny", X_TIE.tolist(), dict(temperature=0.7, top_p=1e-46)),
    ("top_k-2**100", X_TIE.tolist(), dict(top_k=2 ** 100, top_p=0.95)),
    ("seed-2**64-1", X_TIE.tolist(), dict(seed=U64 - 1)),
    ("seed--2**63", X_TIE.tolist(), dict(seed=-2 ** 63, temperature=2.0)),
]


@needs_triton
@pytest.mark.parametrize("case", AGREE, ids=[c[0] for c in AGREE])
def test_kernel_and_twin_agree_on_the_policy_cases(case):
    _, logits, kw = case
    kw = dict(kw)
    seed = kw.pop("seed", 7)
    x = torch.tensor(logits).expand(5, V).contiguous()
    if "input_ids" in kw:
        kw["input_ids"] = kw["input_ids"].expand(5, -1).contiguous()
    call = dict(seed=seed, offset=torch.arange(5) * 1000, return_logprobs=True, **kw)
    tk, lk = gpu_sampler.sample(_d(x), backend="triton", **_dev(call))
    tt, lt = gpu_sampler.sample(x, backend="torch", **call)
    assert torch.equal(tk.cpu(), tt)
    torch.testing.assert_close(lk.cpu(), lt)


@needs_triton
def test_kernel_and_twin_agree_on_invalid_rows_and_wrapped_seeds():
    """17 rows (the twin's numpy rng path): per-row non-finite values mixed with valid rows."""
    B = 17
    x = torch.randn(B, V, generator=torch.Generator().manual_seed(6))
    pres = torch.zeros(B)
    pres[[2, 9]] = torch.tensor([-INF, INF])
    temp = torch.full((B,), 0.8)
    temp[[4, 12]] = torch.tensor([INF, 1e-30])
    kw = dict(presence_penalty=pres, temperature=temp, input_ids=torch.randint(0, V, (B, 4)),
              seed=torch.arange(B) + (2 ** 63 - 8), offset=U64 - 1, check=False,
              return_logprobs=True)
    tk, lk = gpu_sampler.sample(_d(x), backend="triton", **_dev(kw))
    tt, lt = gpu_sampler.sample(x, backend="torch", **kw)
    assert torch.equal(tk.cpu(), tt) and (tt[[2, 4, 9]] == -1).all() and (tt[12] >= 0)
    torch.testing.assert_close(lk.cpu(), lt)


# --- generate() and the CLI --------------------------------------------------------------------

def test_generate_seed_policy():
    from gpu_sampler.hf.generation import generate
    from models import tiny_model
    model = tiny_model("llama", seed=0, vocab_size=300)
    ids = torch.randint(3, 300, (2, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=4, do_sample=True, temperature=1.5)
    with pytest.raises(ValueError, match="seed"):
        generate(model, ids, seed=U64, **kw)
    with pytest.raises(ValueError, match="seed"):
        generate(model, ids, seed=-2 ** 63 - 1, **kw)
    # Rows get seed + row, wrapping at 2**64: 2**64 - 1 is -1, its second row seed 0.
    a = generate(model, ids, seed=U64 - 1, **kw)
    assert torch.equal(a, generate(model, ids, seed=-1, **kw))
    assert torch.equal(a, generate(model, ids, seed=torch.tensor([-1, 0]), **kw))


@pytest.mark.parametrize("seed", [str(U64), str(-2 ** 63 - 1)])
def test_cli_seed_out_of_range_is_one_line(capsys, tmp_path, seed):
    from gpu_sampler import cli
    argv = ["generate", "--model", str(tmp_path / "unused"), "--prompt", "x", "--seed", seed]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("gpu-sampler: error:") and "seed" in lines[0] and seed in lines[0]
    cli._check_sampling(dict(do_sample=True, seed=U64 - 1))  # the largest seed is accepted
