"""Same bits, run to run, on a CUDA device: the settings whose rows take the band read or the
merge's list, repeated, at other chunk counts and in a reversed batch. Compiled kernels run
their programs concurrently (the interpreter runs them one after another), so a missing
barrier or ordering shows up here and nowhere in the CPU suite.

Per case it counts the rows whose (token, logprob) bits differ from the first call's in any
of --repeats calls, at chunk counts 1 and 5, and in the batch reversed; and the rows whose
token lies outside the torch twin's kept set.

    python bench/gpu_determinism.py --out DIR --label after      # DIR/gpu_determinism-after.json
    TRITON_INTERPRET=1 python bench/gpu_determinism.py --smoke --repeats 1 --out /tmp/x
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_workloads import _setting  # noqa: E402
from rows import row_logits  # noqa: E402

import gpu_sampler  # noqa: E402
from gpu_sampler.kernels.sampling import fused_sample  # noqa: E402

CASES = [(B, V, k, s) for B, V in ((64, 128256), (256, 151936))
         for s in ("T1.0 p0.95", "T0.6 p0.9", "mixed", "T1.0 minp0.05", "tuned")
         for k in ("flat", "sigma3", "powerlaw", "confident")]


def _rows_differ(a, b):
    return (a[0] != b[0]) | (a[1].view(torch.int32) != b[1].view(torch.int32))


def one(B, V, kind, name, repeats, dev="cuda"):
    x = row_logits(kind, B, V).to(dev)
    kw, L = _setting(name, B, dev)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (B, L), generator=g).to(dev) if L else None
    seed = torch.arange(B, device=dev, dtype=torch.int64) + 11
    off = torch.full((B,), 5, device=dev, dtype=torch.int64)
    call = dict(input_ids=ids, seed=seed, offset=off, **kw)
    ref = fused_sample(x, **call)
    bad = torch.zeros(B, dtype=torch.bool, device=dev)
    for _ in range(repeats):
        bad |= _rows_differ(fused_sample(x, **call), ref)
    rep = int(bad.sum())
    for chunks in (1, 5):
        bad |= _rows_differ(fused_sample(x, chunks=chunks, **call), ref)
    r = torch.arange(B - 1, -1, -1, device=dev)
    sub = {k: (v[r] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v)
           for k, v in call.items()}
    t, lp = fused_sample(x[r], **sub)
    bad[r] |= _rows_differ((t, lp), (ref[0][r], ref[1][r]))
    probs = gpu_sampler.sampling_distribution(x, backend="torch", input_ids=ids, **kw)
    out = int((probs.gather(1, ref[0][:, None]) <= 0).sum())
    return dict(B=B, V=V, kind=kind, setting=name, rows=B, repeats=repeats,
                rows_differing_run_to_run=rep, rows_differing_any=int(bad.sum()),
                tokens_outside_twin_support=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--label", default="this")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="(3, 4099), two cases, on CPU")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting cases past this")
    a = ap.parse_args(argv)
    t0, rows = time.time(), []
    dev = "cpu" if a.smoke else "cuda"
    cases = [(3, 4099, "flat", "T1.0 p0.95"), (3, 4099, "sigma3", "mixed")] if a.smoke else CASES
    for B, V, kind, name in cases:
        if time.time() - t0 > a.budget_s:
            break
        rows.append(one(B, V, kind, name, a.repeats, dev))
        print(json.dumps(rows[-1]), flush=True)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"gpu_determinism-{a.label}.json"), "w") as f:
            gpu = torch.cuda.get_device_name() if dev == "cuda" else dev
            json.dump(dict(gpu=gpu, seconds=round(time.time() - t0, 1), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
