"""Random calls of gpu_sampler.sample on both backends (Triton under the interpreter, the torch
twin): the same tokens, logprobs within 2e-4 (the top-N ids and logprobs too). Each seed draws
B, V, the logits' dtype, per-row kinds (flat, sigma3, confident, power-law, tie-heavy,
-inf-heavy, five finite tokens), scalar or per-row temperature / top-k / top-p / min-p, and
with --wide also penalties with a history (padding, prompt lengths), a token mask, a logit
bias, an amateur model (contrastive decoding) and top-N logprobs. check=False on both, so rows
with nothing to sample are compared too (-1 / -inf). Prints one line per mismatch or error.

    python bench/fuzz_twin.py --seeds 2000:2400            # ~20 min on the 2-core machine
    python bench/fuzz_twin.py --wide --seeds 5000:5300     # ~8 min
"""
import argparse
import os
import random
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

KINDS = ("flat", "sigma3", "confident", "power", "ties", "ninf", "fewfin")


def row(kind, V, g):
    """One [V] float32 row of a kind (module docstring)."""
    x = torch.randn(V, generator=g)
    if kind == "sigma3":
        x = 3 * x
    elif kind == "confident":
        x[torch.randint(V, (3,), generator=g)] += 15
    elif kind == "power":
        rank = torch.randperm(V, generator=g).float() + 1
        x = -1.1 * torch.log(rank) + 0.1 * x
    elif kind == "ties":
        x = torch.round(4 * x) / 2
    elif kind == "ninf":
        x = torch.where(torch.rand(V, generator=g) < 0.8, float("-inf"), 3 * x)
    elif kind == "fewfin":
        x = torch.full((V,), float("-inf"))
        x[torch.randint(V, (5,), generator=g)] = torch.randn(5, generator=g)
    return x


def param(rng, values, B, dtype=torch.float32):
    """A number for every row or (half the time) a tensor with one value per row."""
    if rng.random() < 0.5:
        return torch.tensor([rng.choice(values) for _ in range(B)], dtype=dtype)
    return rng.choice(values)


# (temperature, top_k, top_p, min_p) users send (bench/workloads.py's settings)
PRESETS = ((0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.6, 0, 0.9, 0.0), (1.0, 0, 0.95, 0.0),
           (1.0, 0, 1.0, 0.05), (1.0, 50, 1.0, 0.0), (0.7, 20, 0.8, 0.0))


def sampling_kwargs(rng, B):
    """Half the seeds: a preset per row (a mixed batch); else each parameter drawn alone."""
    if rng.random() < 0.5:
        rows = [rng.choice(PRESETS) for _ in range(B)]
        cols = [torch.tensor(c, dtype=torch.int64 if i == 1 else torch.float32)
                for i, c in enumerate(zip(*rows))]
        return dict(zip(("temperature", "top_k", "top_p", "min_p"), cols))
    return dict(temperature=param(rng, [0.0, 0.3, 0.6, 1.0, 1.5], B),
                top_k=param(rng, [0, 0, 1, 20, 50, 1000], B, torch.int64),
                top_p=param(rng, [1.0, 1.0, 0.5, 0.9, 0.95, 0.99], B),
                min_p=param(rng, [0.0, 0.0, 0.02, 0.05, 0.2], B))


def wide_kwargs(rng, g, L, kw):
    """Penalties with a history, a mask, a bias, an amateur and top-N, each now and then."""
    B, V = L.shape
    if rng.random() < 0.5:
        kw.update(repetition_penalty=param(rng, [1.0, 1.3, 0.8], B),
                  presence_penalty=param(rng, [0.0, 0.5, -0.3], B),
                  frequency_penalty=param(rng, [0.0, 0.3], B))
        n = rng.choice([1, 8, 40])
        ids = torch.randint(V, (B, n), generator=g)
        ids[:, : n // 3 if rng.random() < 0.3 else 0] = -1
        kw["input_ids"] = ids
        if rng.random() < 0.5:
            kw["prompt_lens"] = rng.choice([0, n // 2, n])
    if rng.random() < 0.3:
        words = torch.randint(-2 ** 31, 2 ** 31 - 1, (B, (V + 31) // 32), generator=g)
        kw["allowed_mask"] = words.to(torch.int32)
    if rng.random() < 0.3:
        nb = rng.choice([1, 5])
        vals = torch.randn(B, nb, generator=g) * 3
        vals[0, 0] = float("-inf") if rng.random() < 0.3 else vals[0, 0]
        kw["logit_bias"] = (torch.randint(-1, V, (B, nb), generator=g), vals)
    if rng.random() < 0.2:
        kw.update(amateur_logits=(L.float() * 0.5 + torch.randn(B, V, generator=g)).to(L.dtype),
                  cd_alpha=rng.choice([0.0, 0.1, 1.0]), cd_beta=rng.choice([0.0, 0.5]))
    if rng.random() < 0.4:
        kw.update(top_logprobs=rng.choice([0, 3, 10]),
                  logprobs_mode=rng.choice(["raw", "processed"]))


def case(seed, wide):
    """(logits, kwargs) of one seed."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    B = rng.choice([1, 1, 2, 3, 5])
    V = rng.choice([100, 997, 4096, 12345, 32000] if wide else [997, 4096, 12345, 32000, 50257])
    kinds = [rng.choice(KINDS) for _ in range(B)]
    dtypes = [torch.float32, torch.float32, torch.bfloat16] + ([torch.float16] if wide else [])
    L = torch.stack([row(k, V, g) for k in kinds]).to(rng.choice(dtypes))
    kw = sampling_kwargs(rng, B)
    if wide:
        wide_kwargs(rng, g, L, kw)
    kw.update(seed=torch.randint(0, 2 ** 62, (B,), generator=g),
              offset=torch.randint(0, 1000, (B,), generator=g))
    return L, kw, kinds


def same(a, b):
    """Tokens (ids) equal, float outputs within 2e-4."""
    if a.is_floating_point():
        return torch.allclose(a, b, atol=2e-4, rtol=1e-4, equal_nan=True)
    return torch.equal(a, b)


def run_both(seed, L, kw, wide):
    """(Triton outputs, twin outputs). Without --wide, half the seeds call the kernels' own
    entry with a small geometry (64-256-token blocks, 8-32 candidate slots, 1 or 3 programs
    a row), which sends rows of these small V to the paths a 128K row takes (the band read,
    the second read, dirty blocks, the row pass); the result must not change with it."""
    import gpu_sampler
    from gpu_sampler import reference
    rng = random.Random(-seed)
    if wide or rng.random() < 0.5:
        return [gpu_sampler.sample(L, **kw, return_logprobs=True, check=False, backend=b)
                for b in ("triton", "torch")]
    from gpu_sampler.kernels import sampling
    geom = dict(tile=rng.choice([64, 128, 256]), cand=rng.choice([8, 16, 32]),
                chunks=rng.choice([None, 1, 3]))
    return sampling.fused_sample(L, **kw, **geom), reference.sample_reference(L, **kw)


def check(seed, wide):
    """None, or a line saying what differed (or failed) at this seed."""
    L, kw, kinds = case(seed, wide)
    try:
        outs = run_both(seed, L, kw, wide)
    except Exception as e:  # noqa: BLE001 - report any failure with its seed
        return f"seed {seed}: {type(e).__name__}: {str(e)[:300]}"
    if all(same(a, b) for a, b in zip(*outs)):
        return None
    shown = {k: (v.tolist() if isinstance(v, torch.Tensor) and v.numel() < 8 else v)
             for k, v in kw.items() if k not in ("input_ids", "allowed_mask", "logit_bias",
                                                 "amateur_logits")}
    return (f"seed {seed}: B={L.shape[0]} V={L.shape[1]} {L.dtype} {kinds} {shown}: "
            f"tokens {outs[0][0].tolist()} vs {outs[1][0].tolist()}, "
            f"logprobs {outs[0][1].tolist()} vs {outs[1][1].tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:100", help="first:last (exclusive)")
    ap.add_argument("--wide", action="store_true", help="penalties, mask, bias, CD, top-N")
    args = ap.parse_args()
    from gpu_sampler.kernels.interpreter import skip_repeated_language_patching
    skip_repeated_language_patching(memo=True)
    lo, hi = (int(v) for v in args.seeds.split(":"))
    bad = 0
    for seed in range(lo, hi):
        line = check(seed, args.wide)
        if line:
            bad += 1
            print(line, flush=True)
    print(f"{hi - lo} seeds, {bad} differing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
