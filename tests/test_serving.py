"""What a serving stack sends with a request: top-N logprobs, token masks, logit bias."""
import pytest
import torch

import gpu_sampler
from tests.conftest import BACKENDS

V = 77  # not a multiple of 32


def _logits(B, g, dtype=torch.float32):
    x = torch.randint(-4, 4, (B, V), generator=g).float()  # tie-heavy
    x[0, 10:] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_logprobs_raw_are_log_softmax_topk(backend, dtype):
    g = torch.Generator().manual_seed(1)
    x = _logits(4, g, dtype)
    out = gpu_sampler.sample(x, top_k=5, seed=3, top_logprobs=20, backend=backend)
    ref = torch.log_softmax(x.float(), 1)
    want_vals, want_ids = [], []
    for r in range(4):  # descending, lowest id first among equal values; -inf logits unlisted
        order = sorted(range(V), key=lambda j: (-ref[r, j].item(), j))[:20]
        want_ids.append([j if ref[r, j] > float("-inf") else -1 for j in order])
        want_vals.append(ref[r, order])
    assert out.top_ids.tolist() == want_ids
    torch.testing.assert_close(out.top_logprobs, torch.stack(want_vals))
    assert torch.equal(out.tokens, gpu_sampler.sample(x, top_k=5, seed=3, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_logprobs_processed_are_the_sampled_distribution(backend):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, V, generator=g) * 2
    kw = dict(temperature=0.7, top_k=torch.tensor([0, 4, 30]), top_p=0.8, backend=backend)
    out = gpu_sampler.sample(x, seed=5, top_logprobs=8, logprobs_mode="processed", **kw)
    lp = torch.log(gpu_sampler.sampling_distribution(x, **kw))
    vals, ids = lp.sort(dim=1, descending=True, stable=True)
    # places past the kept set are (-1, -inf)
    assert torch.equal(out.top_ids, torch.where(vals[:, :8] > float("-inf"), ids[:, :8], -1))
    torch.testing.assert_close(out.top_logprobs, vals[:, :8])
    assert bool(torch.isinf(out.top_logprobs[1, 4:]).all()) and out.top_ids[1, 4:].eq(-1).all()
    # The drawn token's logprob is the processed one.
    torch.testing.assert_close(out.logprobs, lp.gather(1, out.tokens[:, None]).squeeze(1))


def test_top_logprobs_wider_than_the_vocabulary_and_zero():
    x = torch.randn(2, 5)
    out = gpu_sampler.sample(x, top_logprobs=7, seed=1)
    assert out.top_ids[:, 5:].eq(-1).all() and torch.isinf(out.top_logprobs[:, 5:]).all()
    assert gpu_sampler.sample(x, top_logprobs=0, seed=1).top_ids.shape == (2, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_logprobs_raw_of_a_nan_row_and_both_backends_agree(backend):
    """A row holding NaN or +inf has no log-softmax: (-1, NaN) everywhere; the other rows are
    the twin's, on both backends, with a mask, a bias and penalties on."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, V, generator=g)
    x[1, 3], x[2, 9] = float("nan"), float("inf")
    allowed = torch.rand(3, V, generator=g) < 0.5
    allowed[:, 0] = True
    kw = dict(temperature=0.8, repetition_penalty=1.2, input_ids=torch.tensor([[1, 2]] * 3),
              allowed_mask=gpu_sampler.pack_mask(allowed),
              logit_bias=(torch.tensor([[4, 5]] * 3), torch.tensor([[2.0, -1.0]] * 3)),
              seed=3, top_logprobs=6, check=False)
    out = gpu_sampler.sample(x, backend=backend, **kw)
    ref = gpu_sampler.sample(x, backend="torch", **kw)
    assert torch.equal(out.top_ids, ref.top_ids) and out.top_ids[1:].eq(-1).all()
    torch.testing.assert_close(out.top_logprobs, ref.top_logprobs, equal_nan=True)
    assert out.top_logprobs[1:].isnan().all()


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_top_logprobs_with_contrastive_scores_equal_the_torch_backend(mode):
    """Contrastive decoding (and with a bias: its scores materialised) on the kernel: the same
    top-N as the twin, raw of the expert logits as given."""
    if "triton" not in BACKENDS:
        pytest.skip("needs the Triton backend")
    g = torch.Generator().manual_seed(5)
    x, a = torch.randn(3, V, generator=g) * 2, torch.randn(3, V, generator=g)
    for bias in (None, (torch.tensor([[4]] * 3), torch.tensor([[1.5]] * 3))):
        kw = dict(amateur_logits=a, temperature=0.9, top_p=0.9, seed=2, top_logprobs=5,
                  logprobs_mode=mode, logit_bias=bias)
        got = gpu_sampler.sample(x, backend="triton", **kw)
        want = gpu_sampler.sample(x, backend="torch", **kw)
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.top_ids, want.top_ids)
        torch.testing.assert_close(got.top_logprobs, want.top_logprobs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_equals_the_masked_chain(backend):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, V, generator=g) * 2
    allowed = torch.rand(4, V, generator=g) < 0.4
    allowed[:, 40] = True
    hist = torch.randint(0, V, (4, 9), generator=g)
    kw = dict(temperature=0.9, top_k=10, top_p=0.9, repetition_penalty=1.4, input_ids=hist,
              backend=backend)
    got = gpu_sampler.sampling_distribution(x, allowed_mask=gpu_sampler.pack_mask(allowed), **kw)
    want = gpu_sampler.sampling_distribution(x.masked_fill(~allowed, float("-inf")), **kw)
    torch.testing.assert_close(got, want)
    assert bool((got[~allowed] == 0).all())
    tok = gpu_sampler.sample(x, allowed_mask=gpu_sampler.pack_mask(allowed), seed=9, **kw)
    assert bool(allowed.gather(1, tok[:, None]).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_logit_bias_duplicates_add_and_inf_bans_or_forces(backend):
    x = torch.zeros(3, V)
    ids = torch.tensor([[5, 5, -1], [7, 8, 9], [3, -1, -1]])
    vals = torch.tensor([[1.0, 1.5, 9.0], [float("-inf"), float("-inf"), 0.0],
                         [float("inf"), 0.0, 0.0]])
    p = gpu_sampler.sampling_distribution(x, logit_bias=(ids, vals), backend=backend)
    want0 = torch.softmax(torch.zeros(V).index_put_((torch.tensor([5]),), torch.tensor(2.5)), 0)
    torch.testing.assert_close(p[0], want0)  # 1.0 + 1.5 at id 5; the padding adds nothing
    assert p[1, 7] == 0 and p[1, 8] == 0 and p[1, 9] > 0
    assert p[2, 3] == 1.0  # +inf forces the token (the overflow rule)


def test_nothing_allowed_is_an_invalid_row():
    x = torch.randn(2, V)
    allowed = torch.ones(2, V, dtype=torch.bool)
    allowed[1] = False
    with pytest.raises(ValueError, match="allowed_mask row 1 allows no token"):
        gpu_sampler.sample(x, allowed_mask=gpu_sampler.pack_mask(allowed), seed=1)
    tok = gpu_sampler.sample(x, allowed_mask=gpu_sampler.pack_mask(allowed), seed=1, check=False)
    assert tok[0] >= 0 and tok[1] == -1


@pytest.mark.parametrize("kw, match", [
    (dict(allowed_mask=torch.zeros(2, 3, dtype=torch.int64)), "allowed_mask must be an int32"),
    (dict(allowed_mask=torch.zeros(2, 2, dtype=torch.int32)), r"\[2, 3\]"),
    (dict(logit_bias=(torch.tensor([[V]] * 2), torch.ones(2, 1))), "logit_bias ids contain 77"),
    (dict(logit_bias=torch.ones(2, 1)), "logit_bias must be a pair"),
    (dict(logit_bias=(torch.tensor([[1]] * 2), torch.tensor([[float("nan")]] * 2))), "NaN"),
    (dict(top_logprobs=65), "top_logprobs"),
    (dict(top_logprobs=-1), "top_logprobs"),
    (dict(top_logprobs=3, logprobs_mode="final"), "logprobs_mode"),
])
def test_bad_serving_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        gpu_sampler.sample(torch.randn(2, V), seed=1, **kw)


def test_torch_compile_fullgraph_traces_a_decode_step():
    from tests.models import tiny_model

    model = tiny_model("llama", seed=4)
    ids = torch.randint(3, 1000, (3, 6), generator=torch.Generator().manual_seed(4))
    seeds, pos = torch.tensor([5, 6, 7]), torch.tensor([6, 6, 6])

    def step(ids, seeds, pos):
        logits = model(input_ids=ids).logits[:, -1, :]
        return gpu_sampler.sample(logits, temperature=0.8, top_k=torch.tensor([0, 20, 5]),
                                  top_p=0.9, repetition_penalty=1.3, input_ids=ids, seed=seeds,
                                  offset=pos, return_logprobs=True)

    with torch.no_grad():
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(ids, seeds, pos)
        eager = step(ids, seeds, pos)
    assert torch.equal(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])


def test_the_torch_op_is_registered_correctly():
    x = torch.randn(2, 50)
    r = lambda v, dt=torch.float32: torch.full((2,), v, dtype=dt)  # noqa: E731
    args = (x, r(0.7), r(5, torch.int64), r(0.9), r(0.0), r(1.1), r(0.0), r(0.0),
            torch.randint(0, 50, (2, 4)), None, r(3, torch.int64), r(0, torch.int64), "auto")
    torch.library.opcheck(torch.ops.gpu_sampler.sample.default, args)
    with pytest.raises(Exception, match="top_logprobs"):  # dynamo wraps the error
        torch.compile(lambda t: gpu_sampler.sample(t, top_logprobs=2, seed=1), fullgraph=True,
                      backend="eager")(x)


def test_sampler_slots_buffers_and_batch_independence():
    g = torch.Generator().manual_seed(8)
    slots, sampler = gpu_sampler.SamplingSlots(4), gpu_sampler.Sampler(4, V)
    confs = [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9),
             dict(temperature=1.0, top_k=5), dict(temperature=0.7, min_p=0.1)]
    for i, c in enumerate(confs):
        slots.set_row(i, seed=100 + i, offset=10, **c)
    ptrs = (sampler.tokens.data_ptr(), sampler.logprobs.data_ptr(), slots.offset.data_ptr())
    for step in range(3):
        x = torch.randn(4, V, generator=g)
        tok, logp = sampler(x, slots, return_logprobs=True)
        for i, c in enumerate(confs):  # each row is the request alone, at its position
            row = {k: torch.tensor([v]) for k, v in c.items()}  # per-row, as the slots are
            want = gpu_sampler.sample(x[i:i + 1], seed=100 + i, offset=10 + step,
                                      return_logprobs=True, **row)
            assert int(tok[i]) == int(want[0])
            # The twin sums a row's mass over a candidate window sized by the whole batch, so
            # its logprob may differ in the last bit (the kernel's does not).
            torch.testing.assert_close(logp[i], want[1][0], rtol=1e-6, atol=1e-6)
    assert (sampler.tokens.data_ptr(), sampler.logprobs.data_ptr(),
            slots.offset.data_ptr()) == ptrs
    assert slots.offset.tolist() == [13] * 4
    slots.set_row(1, temperature=0.0, seed=5)  # a new request in slot 1: defaults elsewhere
    assert float(slots.top_p[1]) == 1.0 and int(slots.offset[1]) == 0
    x = torch.randn(2, V, generator=g)
    assert int(sampler(x, slots)[1]) == int(x[1].argmax())
    with pytest.raises(ValueError, match="top_p"):
        slots.set_row(0, top_p=1.5)
    with pytest.raises(ValueError, match="logits must be"):
        sampler(torch.randn(5, V), slots)


def test_serving_loop_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "serving_loop.py"
    spec = importlib.util.spec_from_file_location("serving_loop", path)
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    model = loop.tiny_model()
    done = {r.name: r for r in loop.serve(loop.example_requests(), max_batch=3, model=model)}
    assert len(done) == 5
    for r in done.values():
        assert len(r.out) == r.max_new and len(r.top) == r.max_new
        assert all(len(t) == r.top_n for t in r.top)
    assert all(48 <= t <= 57 for t in done["digits only"].out)
    g = done["greedy"]
    ref = model.generate(torch.tensor([g.prompt]), max_new_tokens=g.max_new, do_sample=False,
                         pad_token_id=0)
    assert ref[0, len(g.prompt):].tolist() == g.out


def test_twin_row_bits_do_not_depend_on_the_other_rows_top_k():
    # the twin's candidate window is max(top_k) + 1 (grown for other rows): its zero columns
    # must not change a row's Z (e.sum(1)'s vectorised order did, in the last bits)
    for s in range(12):
        x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(s)) * 3
        kw = dict(temperature=0.5, offset=0, return_logprobs=True, backend="torch")
        solo = gpu_sampler.sample(x[:1], top_k=50, seed=s, top_logprobs=4,
                                  logprobs_mode="processed", **kw)
        p1 = gpu_sampler.sampling_distribution(x[:1], top_k=50, temperature=0.5, backend="torch")
        for other_k in (0, 200, 4000):
            k = torch.tensor([50, other_k])
            pair = gpu_sampler.sample(x, top_k=k, seed=torch.tensor([s, s]), top_logprobs=4,
                                      logprobs_mode="processed", **kw)
            p2 = gpu_sampler.sampling_distribution(x, top_k=k, temperature=0.5, backend="torch")
            assert torch.equal(pair.tokens[:1], solo.tokens)
            assert torch.equal(pair.logprobs[:1].view(torch.int32), solo.logprobs.view(torch.int32))
            assert torch.equal(pair.top_logprobs[:1].view(torch.int32),
                               solo.top_logprobs.view(torch.int32))
            assert torch.equal(p2[0].view(torch.int32), p1[0].view(torch.int32))


@pytest.mark.parametrize("bad", [dict(temperature=0.9, top_p=1.5, seed=2),
                                 dict(temperature=0.9, seed=2 ** 64),
                                 dict(temperature=0.9, seed=2, offset=-2 ** 64)])
def test_a_refused_set_row_leaves_the_slot_as_it_was(bad):
    slots = gpu_sampler.SamplingSlots(2)
    slots.set_row(0, temperature=0.3, top_p=0.5, seed=1, offset=10)
    names = ("temperature", "top_k", "top_p", "min_p", "seed", "offset")
    before = [getattr(slots, n).clone() for n in names]
    with pytest.raises(ValueError):
        slots.set_row(0, **bad)
    assert all(torch.equal(getattr(slots, n), b) for n, b in zip(names, before))
