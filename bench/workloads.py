"""Exact passes over the logits, programs per row and launches for the sampling settings users run,
on row kinds whose kept sets span 1 token to > 10^4 (counted under the interpreter, no GPU).

Row kinds (V tokens, generator seeded per row kind):
    sigma3      N(0, 3^2) logits (the tuned case's rows)
    confident   N(0, 1.5^2) bulk plus three dominant tokens at +14, +12.5, +11 (kept sets 1-3)
    flat        N(0, 1) (top-p nuclei of ~10^5 tokens)
    powerlaw    -1.1 log(rank) + N(0, 0.1^2), ranks a random permutation of 1..V (Zipf-like)
Settings: greedy, greedy + logprobs, T 1.0 alone, T 0.6 p 0.9, T 1.0 p 0.95, T 1.0 min-p 0.05,
T 0.7 k 20 p 0.8 rep 1.05 (L = 128 history), T 1.0 k 50 alone, and a mixed serving batch: five
rows of the same kind in one call with per-row tensors (greedy, T 1.0, T 1.0 p 0.95, T 0.7 k 50,
T 1.0 min-p 0.05), passes averaged over its rows.

Passes over the logits = bytes loaded from the logits / (rows * V * element size). They do not
depend on the chunk plan (each block is read by exactly one stage-1 program; the merge's
re-reads are per row), so every case runs with B = 64's plan (16 stage-1 programs a row, fewer
interpreter programs than B = 1's 126); "min programs/row" is the smallest grid per row among
the launches that read the logits, given for B = 1's plan and B = 64's.

    python bench/workloads.py                       # every case, fp32 and bf16
    python bench/workloads.py --kinds flat --settings "T1.0 p0.95" --dtypes fp32
    python bench/workloads.py --kernels /tmp/old/kernels --label old
"""
import argparse
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from triton.runtime import interpreter as ti  # noqa: E402

from rows import KINDS, MIXED_ROWS, SETTINGS, mixed_kwargs, row_logits  # noqa: E402,F401
from traffic import Counter, load_kernels  # noqa: E402

V_DEFAULT = 128256


def measure(mod, kind, setting, dtype, V, plan_batch):
    ks = mod.sampling
    kw, L = SETTINGS[setting]
    rows = MIXED_ROWS if kw is None else 1
    if kw is None:
        kw = mixed_kwargs(rows)
    logits = row_logits(kind, rows, V).to(dtype)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (rows, L), generator=gen) if L else None
    c = Counter()
    c.tag(logits, "logits")
    if ids is not None:
        c.tag(ids, "history")
    saved = {n: getattr(ks, n) for n in ("_alloc", "_workspace") if hasattr(ks, n)}

    def tagged(orig, kind_):
        def alloc(shape, dt, device):
            t = orig(shape, dt, device)
            c.tag(t, kind_)
            return t
        return alloc

    base = (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
            ti.GridExecutor.__call__)
    for n, f in saved.items():
        setattr(ks, n, tagged(f, "outputs" if n == "_alloc" else "workspace"))
    try:
        c.install()
        tok, lp = mod.fused_sample(logits, input_ids=ids, seed=1, offset=0,
                                   chunks=ks.plan(plan_batch, V)["C"], **kw)
    finally:
        for n, f in saved.items():
            setattr(ks, n, f)
        (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
         ti.GridExecutor.__call__) = base
    passes = c.total("logits", "load") / (rows * V * logits.element_size())
    # per launch: does it read the logits, and its programs per row
    reading = []
    for i, (name, grid) in enumerate(c.launches):
        if c.bytes.get((i, "logits", "load"), 0) > 0:
            g = tuple(grid) + (1, 1)
            reading.append(g[1] * g[2] > 1)  # (B, C) grid: C programs per row, else 1
    return passes, reading, len(c.launches), tok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--V", type=int, default=V_DEFAULT)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--settings", default=";".join(SETTINGS))
    ap.add_argument("--dtypes", default="fp32,bf16")
    a = ap.parse_args(argv)
    mod = load_kernels(a.kernels)
    V = a.V
    c1, c64 = mod.sampling.plan(1, V)["C"], mod.sampling.plan(64, V)["C"]
    kinds = a.kinds.split(",")
    print(f"# workloads of {a.label}, V = {V}: exact passes over the logits (interpreter); "
          f"min programs/row over logits-reading launches at B = 1 / B = 64; launches")
    print("| setting | dtype | " + " | ".join(kinds) + " | min programs/row (B=1 / 64) | "
          "launches |")
    print("|---|---|" + "---|" * len(kinds) + "---|---|")
    t0 = time.time()
    for setting in a.settings.split(";"):
        for dt in a.dtypes.split(","):
            dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[dt]
            cells, progs, nl = [], set(), 0
            for kind in kinds:
                passes, reading, nl, _ = measure(mod, kind, setting, dtype, V, 64)
                cells.append(f"{passes:.3f}")
                progs.update(reading)
            worst = (f"{c1} / {c64}" if all(progs) else "1 / 1")
            print(f"| {setting} | {dt} | " + " | ".join(cells) + f" | {worst} | {nl} |",
                  flush=True)
    print(f"# {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
