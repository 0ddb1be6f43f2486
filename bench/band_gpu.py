"""The band read (kernels/band.py) on a CUDA device: tokens against the torch twin, invariance to
the chunk count and the batch, and GPU time per call (CUDA-graph replay) and per kernel
(torch.profiler, eager), for the row kinds and settings of issue 17 at V = 128256.

    python bench/band_gpu.py --label bandfast --out DIR     # writes DIR/band_gpu-<label>.json

Runs whatever gpu_sampler the interpreter imports (PYTHONPATH picks main or a branch), so two
runs compare two checkouts on the same machine. Needs only torch and triton.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_workloads import _graph_us, _kernels as _kernel_table  # noqa: E402  (one copy)
from rows import row_logits  # noqa: E402

from gpu_sampler import reference  # noqa: E402
from gpu_sampler.kernels.sampling import fused_sample, plan  # noqa: E402

V = 128256
CASES = [  # (row kind, kwargs, history length)
    ("flat", dict(temperature=1.0, top_p=0.95), 0),
    ("powerlaw", dict(temperature=1.0, top_p=0.95), 0),
    ("sigma3", dict(temperature=1.0, top_p=0.95), 0),
    ("flat", dict(temperature=0.6, top_p=0.9), 0),
    ("sigma3", dict(temperature=0.6, top_p=0.9), 0),
    ("sigma3", dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2), 128),
]


def _kernels(fn, calls=10):
    """Our kernels' eager GPU µs per call."""
    return {k: us for k, (_, us) in _kernel_table(fn, calls).items() if k.startswith("_")}


def one(B, kind, kw, L):
    x = row_logits(kind, B, V).cuda()
    g = torch.Generator(device="cuda").manual_seed(7)
    ids = torch.randint(0, V, (B, L), device="cuda", generator=g) if L else None
    seed = torch.arange(B, device="cuda", dtype=torch.int64) + 11
    off = torch.full((B,), 5, device="cuda", dtype=torch.int64)
    c0 = plan(B, V)["C"]

    def call(chunks=c0, rows=None):
        r = slice(None) if rows is None else rows
        return fused_sample(x[r], input_ids=None if ids is None else ids[r], seed=seed[r],
                            offset=off[r], chunks=chunks, **kw)

    tok, lp = call()
    ttok, tlp = reference.sample_reference(x, input_ids=ids, seed=seed, offset=off, **kw)
    fin = torch.isfinite(tlp)
    res = dict(B=B, kind=kind, setting=kw, L=L,
               tokens_equal_twin=int((tok == ttok).sum()),
               logprob_max_abs_diff=float((lp - tlp)[fin].abs().max()) if fin.any() else 0.0)
    inv = True
    for chunks in (1, 5):
        t2, l2 = call(chunks)
        inv &= bool(torch.equal(t2, tok) and torch.equal(l2, lp))
    if B > 1:
        r = torch.tensor([B - 1, 0], device="cuda")
        t3, l3 = call(rows=r)
        inv &= bool(torch.equal(t3, tok[r]) and torch.equal(l3, lp[r]))
    res["bit_identical_chunks_1_5_and_sub_batch"] = inv
    res["graph_us"] = round(_graph_us(call), 2)
    res["kernels_us_eager"] = _kernels(call)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="this")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    rows = []
    for B in (1, 64):
        for kind, kw, L in CASES:
            r = one(B, kind, kw, L)
            rows.append(r)
            print(json.dumps(r), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"band_gpu-{a.label}.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
