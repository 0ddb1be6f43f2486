"""The compiled Triton kernel on CUDA tensors: large vocabularies, large batches, fp32 / bf16.

Skipped without CUDA. On a GPU box (see bench/gpu_check.sh):
    GPU_SAMPLER_TEST_DEVICE=cuda python -m pytest tests/test_sampler.py tests/test_gpu.py
References: transformers' processors (row by row, on CPU) up to V = 151936; for V = 262144 the
torch backend of gpu_sampler on the same GPU, which the CPU tests pin to transformers.
"""
import pytest
import torch

import gpu_sampler
from hf_reference import hf_probs, rule_probs, split_tie_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = "cuda"
ATOL = 2e-6
KW = dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2)


def _logits(B, V, dtype, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, V, generator=g) * scale).to(dtype), g


def _same_distribution(ours, ref, what):
    diff = (ours > 0) != (ref > 0)
    assert not diff.any(), f"{what}: support differs at (row, token) {diff.nonzero()[:5].tolist()}"
    err = (ours - ref).abs().max().item()
    assert err <= ATOL * max(1.0, ref.max().item()), f"{what}: max abs diff {err}"


def _hf_reference(logits, **kw):
    """HF's chain; where HF's unstable sort split a tie group at the top-p cut-off (common with
    bf16 logits), the documented rule instead."""
    ref = hf_probs(logits, **kw)
    for b in split_tie_rows(logits, ref, **kw):
        row = {n: (v[b:b + 1] if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
        ref[b] = rule_probs(logits[b:b + 1], **row)[0]
    return ref


@pytest.mark.parametrize("B,V,dtype", [
    (1, 32000, torch.float32), (256, 32000, torch.bfloat16), (8, 128256, torch.float32),
    (64, 128256, torch.bfloat16), (4, 151936, torch.float32), (16, 151936, torch.bfloat16),
], ids=lambda x: str(x).replace("torch.", ""))
def test_triton_distribution_matches_hf(B, V, dtype):
    logits, g = _logits(B, V, dtype, seed=B * 7 + V)
    ids = torch.randint(0, V, (B, 128), generator=g)
    ours = gpu_sampler.sampling_distribution(logits.to(CUDA), input_ids=ids.to(CUDA),
                                             backend="triton", **KW).cpu()
    ref = _hf_reference(logits.float(), input_ids=ids, **KW)
    _same_distribution(ours, ref, f"({B}, {V}) {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_per_row_params_match_hf(dtype):
    B, V = 32, 128256
    logits, g = _logits(B, V, dtype, seed=21)
    kw = dict(temperature=torch.rand(B, generator=g) * 1.5,  # includes near-greedy rows
              top_k=torch.randint(0, 200, (B,), generator=g),
              top_p=torch.rand(B, generator=g) * 0.5 + 0.5,
              min_p=torch.where(torch.rand(B, generator=g) < 0.5, 0.05, 0.0),
              repetition_penalty=torch.rand(B, generator=g) * 0.5 + 1.0,
              input_ids=torch.randint(0, V, (B, 64), generator=g))
    kw["temperature"][::5] = 0.0  # greedy rows mixed into the batch
    ours = gpu_sampler.sampling_distribution(
        logits.to(CUDA), backend="triton", **{n: v.to(CUDA) for n, v in kw.items()}).cpu()
    _same_distribution(ours, _hf_reference(logits.float(), **kw), f"per-row {dtype}")


@pytest.mark.parametrize("B", [1, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_262144_triton_equals_torch_backend(B, dtype):
    V = 262144
    logits, g = _logits(B, V, dtype, seed=B)
    logits = logits.to(CUDA)
    ids = torch.randint(0, V, (B, 128), generator=g).to(CUDA)
    kw = dict(KW, input_ids=ids, presence_penalty=0.2, frequency_penalty=0.1,
              prompt_lens=torch.full((B,), 64, device=CUDA))
    a = gpu_sampler.sampling_distribution(logits, backend="triton", **kw).cpu()
    b = gpu_sampler.sampling_distribution(logits, backend="torch", **kw).cpu()
    _same_distribution(a, b, f"V=262144 B={B} {dtype}")
    seeds, offs = torch.arange(B, device=CUDA) + 5, torch.arange(B, device=CUDA) * 11
    ta = gpu_sampler.sample(logits, backend="triton", seed=seeds, offset=offs, **kw)
    tb = gpu_sampler.sample(logits, backend="torch", seed=seeds, offset=offs, **kw)
    assert torch.equal(ta, tb)


@pytest.mark.parametrize("V", [128256, 151936, 262144])
def test_draws_in_support(V):
    B = 256
    logits, g = _logits(B, V, torch.bfloat16, seed=V)
    logits = logits.to(CUDA)
    kw = dict(temperature=(torch.rand(B, generator=g) + 0.3).to(CUDA),
              top_k=torch.randint(0, 100, (B,), generator=g).to(CUDA), top_p=0.8, min_p=0.01)
    dist = gpu_sampler.sampling_distribution(logits, backend="triton", **kw)
    for s in range(4):
        tok, lp = gpu_sampler.sample(logits, backend="triton", seed=s,
                                     offset=torch.arange(B, device=CUDA), return_logprobs=True,
                                     **kw)
        pt = dist.gather(1, tok[:, None]).squeeze(1)
        assert (pt > 0).all(), f"seed {s}: a draw landed outside the support"
        torch.testing.assert_close(lp, pt.log(), atol=1e-5, rtol=1e-5)
    # the generator path (no seed) as well
    gen = torch.Generator(device=CUDA).manual_seed(0)
    tok = gpu_sampler.sample(logits, backend="triton", generator=gen, **kw)
    assert (dist.gather(1, tok[:, None]) > 0).all()


@pytest.mark.parametrize("V", [32000, 128256, 151936, 262144])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_equals_argmax(V, dtype):
    B = 256
    g = torch.Generator().manual_seed(V)
    # few distinct values: many ties, where the lowest index must win
    logits = torch.randint(0, 50, (B, V), generator=g).to(dtype).to(CUDA)
    tok, lp = gpu_sampler.sample(logits, temperature=0.0, backend="triton", return_logprobs=True)
    assert torch.equal(tok, logits.float().argmax(1))
    assert (lp == 0).all()


@pytest.mark.parametrize("B,V", [(8, 32000), (256, 128256), (128, 151936)])
def test_triton_and_torch_backends_draw_the_same_tokens(B, V):
    logits, g = _logits(B, V, torch.float32, seed=B + V)
    logits = logits.to(CUDA)
    ids = torch.randint(0, V, (B, 96), generator=g).to(CUDA)
    kw = dict(temperature=torch.rand(B, generator=g).to(CUDA) + 0.2,
              top_k=torch.randint(0, 80, (B,), generator=g).to(CUDA), top_p=0.95, min_p=0.02,
              repetition_penalty=1.15, presence_penalty=0.3, frequency_penalty=0.1,
              input_ids=ids, seed=1234, offset=torch.arange(B, device=CUDA) * 3)
    a = gpu_sampler.sample(logits, backend="triton", **kw)
    b = gpu_sampler.sample(logits, backend="torch", **kw)
    assert torch.equal(a, b)


def test_auto_backend_picks_triton_and_is_batch_independent():
    B, V = 64, 128256
    logits, _ = _logits(B, V, torch.bfloat16, seed=3)
    logits = logits.to(CUDA)
    seeds, offs = torch.arange(B, device=CUDA), torch.full((B,), 17, device=CUDA)
    full = gpu_sampler.sample(logits, seed=seeds, offset=offs, **KW)
    tri = gpu_sampler.sample(logits, seed=seeds, offset=offs, backend="triton", **KW)
    assert torch.equal(full, tri)
    rows = torch.tensor([63, 0, 17], device=CUDA)
    sub = gpu_sampler.sample(logits[rows], seed=seeds[rows], offset=offs[rows], **KW)
    assert torch.equal(sub, full[rows])
