"""Contrastive decoding: the scores, sample()/sampling_distribution() with amateur_logits, and
generate(..., amateur_model=...), against plain references of the formula (O'Brien & Lewis 2023)."""
import pytest
import torch
from scipy import stats
from transformers import DynamicCache

import gpu_sampler
from conftest import BACKENDS, DEVICE
from gpu_sampler.contrastive import contrastive_scores, contrastive_scores_reference
from gpu_sampler.hf.generation import generate
from hf_reference import assert_matches_hf, assert_same_distribution
from tests.chisq import assert_drawn_from
from tests.models import left_padded, tiny_model

NINF, INF, NAN = float("-inf"), float("inf"), float("nan")


def plain_scores(e, a, alpha, beta):
    """The paper's objective written directly: softmax head in float64, then the difference."""
    e, a = e.float(), a.float()
    B = e.shape[0]
    alpha = alpha if isinstance(alpha, torch.Tensor) else torch.full((B,), float(alpha))
    beta = beta if isinstance(beta, torch.Tensor) else torch.full((B,), float(beta))
    p = torch.softmax(e.double(), -1)
    head = p >= alpha.double()[:, None] * p.max(1, keepdim=True).values
    b = beta.float()[:, None]
    return torch.where(head, (1 + b) * e - b * a, NINF)


def _pair(kind, B, V, gen):
    if kind == "random":
        e, a = torch.randn(B, V, generator=gen) * 3, torch.randn(B, V, generator=gen) * 3
    elif kind == "ties":  # integer logits: ties in the head and in the scores
        e = torch.randint(0, 5, (B, V), generator=gen).float()
        a = torch.randint(0, 3, (B, V), generator=gen).float()
    else:  # "neginf": most of the expert row is already masked
        e = torch.randn(B, V, generator=gen) * 2
        e[torch.rand(B, V, generator=gen) < 0.7] = NINF
        e[:, 0] = 0.5
        a = torch.randn(B, V, generator=gen) * 2
    return e, a


def _same(x, y):
    """Equal, NaN == NaN."""
    return x.shape == y.shape and bool(((x == y) | (x.isnan() & y.isnan())).all())


@pytest.mark.parametrize("kind", ["random", "ties", "neginf"])
def test_scores_twin_and_kernel_match_the_formula(kind):
    gen = torch.Generator().manual_seed(len(kind))
    B, V = 4, 45
    e, a = _pair(kind, B, V, gen)
    # alpha 0.1 / 0.3 / 0.0 / 1.0 stay off the integer ties' cut-offs (e - M = -1, -2, ...).
    for alpha, beta in ((0.1, 0.5), (torch.tensor([0.3, 0.0, 1.0, 0.1]),
                                      torch.tensor([0.0, 1.0, 2.5, 0.25]))):
        ref = plain_scores(e, a, alpha, beta)
        twin = contrastive_scores(e, a, cd_alpha=alpha, cd_beta=beta, backend="torch")
        assert torch.equal(torch.isinf(twin), torch.isinf(ref))
        torch.testing.assert_close(twin, ref, atol=1e-6, rtol=0)
        if "triton" in BACKENDS:
            dev = {n: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)
                   for n, v in dict(cd_alpha=alpha, cd_beta=beta).items()}
            k = contrastive_scores(e.to(DEVICE), a.to(DEVICE), backend="triton", **dev).cpu()
            assert _same(k, twin), "kernel and twin differ"


CASES = [
    # (V, sampler kwargs, cd_alpha, cd_beta)
    (7, dict(temperature=0.7), 0.1, 0.5),
    (33, dict(temperature=1.3, top_k=5), 0.05, 1.0),
    (33, dict(top_p=0.8, min_p=0.05, repetition_penalty=1.2), 0.2, 0.5),
    (300, dict(temperature=0.8, top_k=40, top_p=0.9), 0.1, 0.5),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["random", "ties", "neginf"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"V{c[0]}-{c[1]}-a{c[2]}-b{c[3]}")
def test_distribution_is_the_sampler_on_the_scores(backend, kind, case):
    """sampling_distribution(e, amateur_logits=a) == transformers' chain on the plain scores."""
    V, kw, alpha, beta = case
    if backend == "triton" and V > 33:
        pytest.skip("interpreter: tiny V only")
    gen = torch.Generator().manual_seed(V * 7 + len(kind))
    B = 3
    e, a = _pair(kind, B, V, gen)
    kw = dict(kw)
    if "repetition_penalty" in kw:
        kw["input_ids"] = torch.randint(0, V, (B, 6), generator=gen)
    dkw = {n: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
    ours = gpu_sampler.sampling_distribution(e.to(DEVICE), amateur_logits=a.to(DEVICE),
                                             cd_alpha=alpha, cd_beta=beta, backend=backend,
                                             **dkw).cpu()
    assert_matches_hf(ours, plain_scores(e, a, alpha, beta), f"{backend} {kind} {case}", **kw)
    assert torch.allclose(ours.sum(1), torch.ones(B), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_row_cd_beta_and_greedy(backend):
    gen = torch.Generator().manual_seed(3)
    B, V = 4, 29
    e, a = _pair("random", B, V, gen)
    beta = torch.tensor([0.0, 0.5, 3.0, 1.0])
    alpha = torch.tensor([0.1, 0.0, 0.5, 1.0])
    scores = plain_scores(e, a, alpha, beta)
    d = gpu_sampler.sampling_distribution(e.to(DEVICE), amateur_logits=a.to(DEVICE),
                                          cd_alpha=alpha.to(DEVICE), cd_beta=beta.to(DEVICE),
                                          temperature=0.9, backend=backend).cpu()
    assert_same_distribution(d, torch.softmax(scores / 0.9, -1), "per-row")
    # temperature 0 is the paper's greedy search: the argmax of the scores.
    tok, lp = gpu_sampler.sample(e.to(DEVICE), amateur_logits=a.to(DEVICE),
                                 cd_alpha=alpha.to(DEVICE), cd_beta=beta.to(DEVICE),
                                 temperature=0.0, backend=backend, return_logprobs=True)
    assert torch.equal(tok.cpu(), scores.argmax(1)) and (lp == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cd_beta_zero_is_the_expert_head(backend):
    """cd_beta = 0: the expert restricted to its plausibility head, whatever the amateur holds
    (even +-inf); with cd_alpha = 0 as well it is plain sampling."""
    gen = torch.Generator().manual_seed(4)
    B, V = 3, 31
    e, _ = _pair("random", B, V, gen)
    a = torch.randn(B, V, generator=gen)
    a[0, :5], a[1, 5:9] = INF, NINF
    p = torch.softmax(e, -1)
    head = p >= 0.2 * p.max(1, keepdim=True).values
    d = gpu_sampler.sampling_distribution(e.to(DEVICE), amateur_logits=a.to(DEVICE),
                                          cd_alpha=0.2, cd_beta=0.0, backend=backend).cpu()
    assert_same_distribution(d, torch.softmax(e.masked_fill(~head, NINF), -1), "beta 0")
    d0 = gpu_sampler.sampling_distribution(e.to(DEVICE), amateur_logits=a.to(DEVICE),
                                           cd_alpha=0.0, cd_beta=0.0, backend=backend).cpu()
    assert_same_distribution(d0, torch.softmax(e, -1), "alpha 0 beta 0")


@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_values(backend):
    """NaN anywhere -> invalid row; amateur -inf on a head token -> +inf score -> only the +inf
    tokens stay; +inf expert tokens are the head; +inf - +inf -> invalid row."""
    V = 8
    e = torch.tensor([[2.0, 1.9, 0.0, -5.0, 1.0, 0.5, 0.0, 0.0]]).repeat(6, 1)
    a = torch.zeros(6, V)
    a[0, 7] = NAN                       # NaN outside the head still kills the row
    e[1, 6] = NAN
    a[2, 1] = NINF                      # head token with amateur -inf: the only survivor
    a[2, 4] = NINF                      # head at alpha 0.1: e = 1.0 is within log(10) of 2.0
    e[3, [2, 5]] = INF                  # expert +inf: the head is its +inf tokens
    a[3, 2] = 1.0
    e[4, 3] = INF
    a[4, 3] = INF                       # +inf - +inf: undefined
    e[5] = NINF                         # nothing finite
    ed, ad = e.to(DEVICE), a.to(DEVICE)
    kw = dict(amateur_logits=ad, cd_alpha=0.1, cd_beta=0.5, backend=backend)
    d = gpu_sampler.sampling_distribution(ed, check=False, **kw).cpu()
    expect = torch.zeros(6, V)
    expect[2, [1, 4]] = 0.5
    expect[3, [2, 5]] = 0.5
    assert torch.equal(d, expect)
    tok = gpu_sampler.sample(ed, check=False, seed=1, **kw).cpu()
    assert tok[[0, 1, 4, 5]].eq(-1).all() and tok[2] in (1, 4) and tok[3] in (2, 5)
    gtok = gpu_sampler.sample(ed, check=False, temperature=0.0, **kw).cpu()
    assert gtok[[0, 1, 4, 5]].eq(-1).all() and gtok[2] == 1 and gtok[3] == 2
    for rows, msg in (([0], "amateur_logits row 0 contains NaN"), ([1], "logits row 0 contains"),
                      ([4], "both \\+inf"), ([5], "row 0 has no finite logit")):
        with pytest.raises(ValueError, match=msg):
            gpu_sampler.sample(ed[rows], amateur_logits=ad[rows], backend=backend)


def test_kernel_and_twin_draw_the_same_tokens():
    if "triton" not in BACKENDS:
        pytest.skip("triton cannot run here")
    gen = torch.Generator().manual_seed(13)
    B, V = 6, 40
    e, a = (x.to(DEVICE) for x in _pair("random", B, V, gen))
    kw = dict(amateur_logits=a, cd_alpha=0.05, cd_beta=torch.rand(B, generator=gen).to(DEVICE),
              temperature=1.1, top_k=10, input_ids=torch.randint(0, V, (B, 5)).to(DEVICE),
              repetition_penalty=1.3, seed=5, offset=torch.arange(B, device=DEVICE))
    assert torch.equal(gpu_sampler.sample(e, backend="triton", **kw),
                       gpu_sampler.sample(e, backend="torch", **kw))


def test_frequencies_match_distribution():
    N = 20000
    e = torch.tensor([[2.0, 1.8, 1.5, 1.0, 0.2, -3.0, 1.7]])
    a = torch.tensor([[2.5, 0.0, 1.0, -1.0, 0.0, 0.0, 1.9]])
    kw = dict(amateur_logits=a, cd_alpha=0.1, cd_beta=0.7, temperature=1.2)
    p = gpu_sampler.sampling_distribution(e, backend="torch", **kw)[0]
    tok = gpu_sampler.sample(e.expand(N, -1), backend="torch", seed=7, offset=torch.arange(N),
                             **{**kw, "amateur_logits": a.expand(N, -1)})
    counts = torch.bincount(tok, minlength=e.shape[1]).double()
    assert (counts[p == 0] == 0).all() and int((p > 0).sum()) == 6  # all but -3.0
    s = p > 0
    res = stats.chisquare(counts[s].numpy(), (p[s].double() / p[s].sum() * N).numpy())
    assert res.pvalue > 1e-3, res


BAD = [
    (dict(amateur_logits=torch.randn(2, 9)), "amateur_logits"),
    (dict(amateur_logits=torch.randn(3, 10)), "amateur_logits"),
    (dict(amateur_logits=torch.randn(2, 10, device="meta")), "amateur_logits"),
    (dict(amateur_logits=torch.randn(2, 10, dtype=torch.float64)), "amateur_logits"),
    (dict(amateur_logits=[[0.0] * 10] * 2), "amateur_logits"),
    (dict(cd_alpha=1.5), "cd_alpha"),
    (dict(cd_alpha=-0.1), "cd_alpha"),
    (dict(cd_alpha=NAN), "cd_alpha"),
    (dict(cd_alpha=torch.tensor([0.5, 1.5])), "cd_alpha"),
    (dict(cd_beta=-1.0), "cd_beta"),
    (dict(cd_beta=INF), "cd_beta"),
    (dict(cd_beta=1e39), "cd_beta"),  # finite in Python, inf in float32
    (dict(cd_beta=torch.tensor([0.5, NAN])), "cd_beta"),
    (dict(cd_beta=torch.tensor([0.5, 0.5, 0.5])), "cd_beta"),
    (dict(cd_beta=torch.tensor([1, 2])), "cd_beta"),
    (dict(cd_beta="0.5"), "cd_beta"),
]


@pytest.mark.parametrize("kw,name", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_arguments(kw, name):
    logits = torch.randn(2, 10)
    kw = {"amateur_logits": torch.randn(2, 10), **kw}
    with pytest.raises(ValueError, match=name):
        gpu_sampler.sample(logits, **kw)
    with pytest.raises(ValueError, match=name):
        gpu_sampler.sampling_distribution(logits, **kw)


def test_cd_parameters_need_amateur_logits():
    for kw in (dict(cd_alpha=0.3), dict(cd_beta=torch.ones(2))):
        with pytest.raises(ValueError, match="needs amateur_logits"):
            gpu_sampler.sample(torch.randn(2, 10), **kw)
    gpu_sampler.sample(torch.randn(2, 10), cd_alpha=0.1, cd_beta=0.5)  # the defaults are fine


def test_twin_direct_matches_public():
    gen = torch.Generator().manual_seed(9)
    e, a = _pair("neginf", 3, 50, gen)
    e = e.to(torch.bfloat16)
    assert _same(contrastive_scores_reference(e, a.half(), 0.1, 0.5),
                 contrastive_scores(e, a.half(), backend="torch"))


# ---- generate(..., amateur_model=...) ------------------------------------------------------------

V = 1000


@pytest.fixture(scope="module")
def expert():
    return tiny_model("llama", seed=21)


@pytest.fixture(scope="module")
def amateur():
    return tiny_model("gpt2", seed=22, hidden_size=32, num_layers=1)


@torch.no_grad()
def _reference_greedy(expert, amateur, ids, mask, steps, alpha, beta):
    """Two transformers forwards per step on DynamicCaches, the formula, argmax."""
    caches = [DynamicCache(config=m.config) for m in (expert, amateur)]
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cur, out = ids, ids
    for _ in range(steps):
        le, la = (m(input_ids=cur, attention_mask=mask, position_ids=pos, past_key_values=c,
                    use_cache=True).logits[:, -1].float()
                  for m, c in zip((expert, amateur), caches))
        tok = plain_scores(le, la, alpha, beta).argmax(1)
        out = torch.cat([out, tok[:, None]], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        cur, pos = tok[:, None], pos[:, -1:] + 1
    return out


@pytest.mark.parametrize("alpha,beta", [(0.1, 0.5), (0.0, 2.0)])
def test_generate_greedy_matches_reference_loop(expert, amateur, alpha, beta):
    ids, mask = left_padded([7, 3, 5], 31)
    steps = 8
    out = generate(expert, ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                   amateur_model=amateur, cd_alpha=alpha, cd_beta=beta)
    ref = _reference_greedy(expert, amateur, ids, mask, steps, alpha, beta)
    assert torch.equal(out, ref)
    plain = generate(expert, ids, attention_mask=mask, max_new_tokens=steps, do_sample=False)
    assert not torch.equal(out, plain), "the amateur changed nothing: the test proves nothing"


def test_generate_cd_beta_zero_is_plain_greedy(expert, amateur):
    """The expert's argmax is always in its head, so cd_beta = 0 greedy is transformers' greedy."""
    ids, mask = left_padded([4, 6], 32)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
    out = generate(expert, ids, amateur_model=amateur, cd_alpha=0.3, cd_beta=0.0, **kw)
    assert torch.equal(out, expert.generate(ids, **kw))


def test_generate_first_token_distribution(expert, amateur):
    """Seeded sampling through generate: the first token's frequencies (chi-square) follow
    sampling_distribution of the two models' prompt logits; step 0's logits are the scores."""
    ids, mask = left_padded([5, 3], 33)
    kw = dict(do_sample=True, temperature=0.3, top_k=40, cd_alpha=0.1, cd_beta=0.5)
    with torch.no_grad():
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        le, la = (m(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
                  for m in (expert, amateur))
    probs = gpu_sampler.sampling_distribution(le, amateur_logits=la, cd_alpha=0.1, cd_beta=0.5,
                                              temperature=0.3, top_k=40, backend="torch")
    n = 2000
    res = generate(expert, ids, attention_mask=mask, max_new_tokens=1, num_return_sequences=n,
                   amateur_model=amateur, seed=11, return_dict_in_generate=True,
                   output_logits=True, **kw)
    torch.testing.assert_close(res.logits[0][::n], plain_scores(le, la, 0.1, 0.5), atol=1e-4,
                               rtol=0)
    first = res.sequences[:, -1].view(2, n)
    for b in range(2):
        assert int((probs[b] > 0).sum()) == 40
        assert_drawn_from(first[b], probs[b])


def test_generate_sampling_seeded_batch_with_padding(expert, amateur):
    ids, mask = left_padded([6, 2, 4], 34)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, seed=3,
              amateur_model=amateur, cd_beta=1.0)
    a, b = generate(expert, ids, **kw), generate(expert, ids, **kw)
    assert torch.equal(a, b) and a.shape == (3, ids.shape[1] + 6)
    # Row 1 alone (its padding trimmed) with the seed it had in the batch: same tokens.
    c = generate(expert, ids[1:2, -2:], **{**kw, "attention_mask": mask[1:2, -2:],
                                            "seed": torch.tensor([4])})
    assert torch.equal(c[:, -6:], a[1:2, -6:])


def test_generate_fused_and_materialised_scores_agree(expert, amateur):
    """Without returned scores the amateur's logits go into sample()'s launches (run.fuse_cd);
    asking for scores materialises them first. Same seeded tokens either way."""
    ids, mask = left_padded([5, 3], 35)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=True, top_p=0.9, seed=8,
              amateur_model=amateur, cd_alpha=0.05, cd_beta=0.7, repetition_penalty=1.3)
    fused = generate(expert, ids, **kw)
    full = generate(expert, ids, return_dict_in_generate=True, output_scores=True, **kw)
    assert torch.equal(fused, full.sequences)


@pytest.mark.parametrize("kwargs,match", [
    (dict(cd_alpha=1.5), "cd_alpha"),
    (dict(cd_alpha=-0.5), "cd_alpha"),
    (dict(cd_beta=-1.0), "cd_beta"),
    (dict(cd_beta=float("inf")), "cd_beta"),
    (dict(cd_alpha=torch.tensor([0.1])), "cd_alpha"),
])
def test_generate_bad_arguments(expert, amateur, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(expert, torch.randint(3, V, (1, 4)), max_new_tokens=2, amateur_model=amateur,
                 **kwargs)


def test_generate_vocabularies_must_agree(expert):
    small = tiny_model("gpt2", seed=23, vocab_size=500, hidden_size=32, num_layers=1)
    with pytest.raises(ValueError, match="500 tokens but model has 1000"):
        generate(expert, torch.randint(3, 500, (1, 4)), max_new_tokens=2, amateur_model=small)
    with pytest.raises(ValueError, match="cd_beta=0.7 needs amateur_model"):
        generate(expert, torch.randint(3, 500, (1, 4)), max_new_tokens=2, cd_beta=0.7)


def test_demo_contrastive_line():
    from gpu_sampler import demo
    from tests.models import train_tokenizer

    tok = train_tokenizer(1000)
    model = tiny_model("llama", seed=24, vocab_size=len(tok))
    res = demo.contrastive_generate(model, tok, demo.PROMPTS[:2], max_new_tokens=3)
    assert len(res["texts"]) == 2 and "1-layer" in res["amateur"] and res["tok_s"] > 0
    assert res["checked"] is True


def test_demo_contrastive_check_catches_a_wrong_token():
    from gpu_sampler import demo, tiny
    from tests.models import train_tokenizer

    tok = train_tokenizer(1000)
    model = tiny_model("llama", seed=24, vocab_size=len(tok))
    amateur = tiny.build_model(len(tok), seed=1, hidden_size=64, num_layers=1)
    batch = tok(list(demo.PROMPTS[:2]), return_tensors="pt", padding=True)
    out = generate(model, **batch, max_new_tokens=4, do_sample=False, amateur_model=amateur)
    assert demo.contrastive_checked(model, amateur, batch, out, 0.1, 0.5)
    # the expert's greedy tokens are not the contrastive ones on these rows
    plain = generate(model, **batch, max_new_tokens=4, do_sample=False)
    assert not torch.equal(plain, out)
    assert not demo.contrastive_checked(model, amateur, batch, plain, 0.1, 0.5)


_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gpu_sampler.kernels.contrastive import _contrastive_scores_kernel as k
for e_t, a_t, per_row in (("bf16", "fp16", True),):
    consts = dict(LA_T=per_row, BETA_T=per_row, TILE=1024)
    sig, ce = {}, {}
    for i, n in enumerate(k.arg_names):
        if n in consts:
            sig[n], ce[(i,)] = "constexpr", consts[n]
        else:
            sig[n] = {"e_ptr": "*" + e_t, "a_ptr": "*" + a_t, "out_ptr": "*fp32",
                      "la_ptr": "*fp32", "beta_ptr": "*fp32", "la_s": "fp32",
                      "beta_s": "fp32"}.get(n, "i32")
    ck = triton.compile(ASTSource(fn=k, signature=sig, constexprs=ce),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 8, "enable_fp_fusion": False})
    print(e_t, a_t, "sm_90 cubin", len(ck.asm["cubin"]), "fma", ck.asm["ptx"].count("fma.rn.f32"))
"""


def test_kernel_compiles_for_sm90_without_fma():
    """The real Triton pipeline (no interpreter) down to an sm_90 cubin; with fp fusion off the
    score is two roundings like the twin's, not one FMA."""
    import os
    import subprocess
    import sys
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if "sm_90 cubin" in ln]
    assert len(lines) == 1 and all(ln.endswith("fma 0") for ln in lines), r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_per_row_parameters_invalidate_only_their_row(backend):
    gen = torch.Generator().manual_seed(14)
    e, a = (x.to(DEVICE) for x in _pair("random", 4, 21, gen))
    alpha = torch.tensor([0.1, 1.5, 0.1, 0.1], device=DEVICE)
    beta = torch.tensor([0.5, 0.5, NAN, INF], device=DEVICE)
    kw = dict(amateur_logits=a, cd_alpha=alpha, cd_beta=beta, backend=backend)
    tok = gpu_sampler.sample(e, check=False, seed=3, **kw).cpu()
    assert tok[0] >= 0 and tok[1:].eq(-1).all()
    d = gpu_sampler.sampling_distribution(e, check=False, **kw).cpu()
    assert torch.allclose(d[0].sum(), torch.tensor(1.0)) and (d[1:] == 0).all()
    with pytest.raises(ValueError, match="cd_alpha has an invalid value 1.5 at row 1"):
        gpu_sampler.sample(e, **kw)
