"""Exact memory traffic of the Triton sampling path, counted under the interpreter (no GPU).

Every masked tl.load / tl.store the kernels issue is recorded by address (lanes whose mask is
off are not counted) and attributed to a tensor: the logits, the history ids, the workspace
(the launcher's scratch buffers), the outputs, or the per-row parameters. Per case it prints
the passes over the logits (bytes loaded from the logits / logits bytes), history and workspace
bytes per row, programs per row and launches.

The interpreter runs programs one after another (30-100 ms each), so each case runs
``--rows`` rows (default 2) with the launch geometry of the real batch (the stage-1 chunk count
chosen for B rows) and scales the per-row bytes; rows are exchangeable N(0, 3^2) logits.

    python bench/traffic.py                         # the kernels of this checkout
    python bench/traffic.py --kernels /tmp/old/kernels --label old   # another copy of kernels/
    python bench/traffic.py --cd                    # contrastive decoding fused in (amateur)

With ``--cd`` each call also gets amateur logits (0.6 x + N(0, 1): correlated with the expert's,
as a smaller model of the same family is) and cd_alpha 0.1, cd_beta 0.5, and the table adds the
passes over the amateur logits.

With ``--speculative K`` each case is ``speculative_sample()`` at (B, K, V) on the Triton
backend: K + 1 target rows per row (one row b traced, the launches planned for the B (K + 1)
rows), one-hot drafts and draft distributions (q), check=False. The passes are over the target
logits; the draft-distribution path also writes p_i (``outputs``) and reads p and q in torch
at the drafts and at one position per row, which the interpreter does not see.
"""
import argparse
import inspect
import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from triton.runtime import interpreter as ti  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rows import request_edits  # noqa: E402

CASES = [(1, 32000), (1, 128256), (8, 128256), (64, 128256), (256, 151936)]
FULL = dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2)
TOP_P = dict(temperature=0.7, top_p=0.9)
GREEDY = dict(temperature=0.0, repetition_penalty=1.2)  # greedy blocks (kernels/stats.py)


class Counter:
    """Bytes by (launch, tensor kind), from the interpreter's load/store entry points."""

    def __init__(self):
        self.ranges = []  # (start, end, kind)
        self.launches = []  # (kernel name, grid)
        self.bytes = {}  # (launch, kind, "load"/"store") -> bytes

    def tag(self, t, kind):
        n = t.untyped_storage().nbytes()
        p = t.untyped_storage().data_ptr()
        self.ranges.append((p, p + n, kind))

    def kind_of(self, addrs):
        kinds = np.full(addrs.shape, "param", dtype=object)
        for lo, hi, kind in self.ranges:
            kinds[(addrs >= lo) & (addrs < hi)] = kind
        return kinds

    def record(self, ptrs, mask, op):
        addrs = np.asarray(ptrs.data, dtype=np.uint64)
        m = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        addrs = addrs[m]
        if addrs.size == 0:
            return
        size = np.dtype(ti._get_np_dtype(ptrs.get_element_ty())).itemsize
        kinds = self.kind_of(addrs)
        launch = len(self.launches) - 1
        for kind in set(kinds.tolist()):
            key = (launch, kind, op)
            self.bytes[key] = self.bytes.get(key, 0) + int((kinds == kind).sum()) * size

    def install(self):
        b = ti.InterpreterBuilder
        load, store, call = b.create_masked_load, b.create_masked_store, ti.GridExecutor.__call__
        counter = self

        def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
            counter.record(ptrs, mask, "load")
            return load(self, ptrs, mask, other, cache_policy, is_volatile)

        def masked_store(self, ptrs, value, mask, cache_policy):
            counter.record(ptrs, mask, "store")
            return store(self, ptrs, value, mask, cache_policy)

        def run(self, *args, **kwargs):
            counter.launches.append((self.fn.__name__, self.grid))
            return call(self, *args, **kwargs)

        b.create_masked_load, b.create_masked_store, ti.GridExecutor.__call__ = (
            masked_load, masked_store, run)

    def total(self, kind, op=None):
        return sum(v for (_, k, o), v in self.bytes.items() if k == kind and (op is None or o == op))


def load_kernels(path):
    # the current checkout's shortcut through Triton's interpreter (global, whichever kernels)
    from gpu_sampler.kernels.interpreter import skip_repeated_language_patching
    skip_repeated_language_patching()
    if path is None:
        return importlib.import_module("gpu_sampler.kernels")
    parent, name = os.path.split(os.path.abspath(path))
    sys.path.insert(0, parent)
    return importlib.import_module(name)


def measure(mod, B, V, L, kw, rows, seed=0, cd=False, with_edits=False, top_n=0):
    """Counter for one call on `rows` rows with the geometry of B rows."""
    ks = mod.sampling
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=gen) * 3
    ids = torch.randint(0, V, (rows, L), generator=gen) if L else None
    c = Counter()
    c.tag(logits, "logits")
    if cd:
        amateur = logits * 0.6 + torch.randn(rows, V, generator=gen)
        c.tag(amateur, "amateur")
        kw = dict(kw, amateur_logits=amateur, cd_alpha=0.1, cd_beta=0.5)
    if ids is not None:
        c.tag(ids, "history")
    extra = request_edits(rows, V, gen) if with_edits else {}
    if top_n:
        extra["top_n"] = top_n
    if "plan_batch" in inspect.signature(mod.fused_sample).parameters:
        extra["plan_batch"] = B
    elif hasattr(ks, "plan"):  # an older kernels/ folder
        extra["chunks"] = ks.plan(B, V)["C"]
    saved = {n: getattr(ks, n) for n in ("_alloc", "_workspace", "edit_table")
             if hasattr(ks, n)}

    def tagged(orig, kind):
        def alloc(*args):
            t = orig(*args)
            c.tag(t, kind)
            return t
        return alloc

    kinds = dict(_alloc="outputs", _workspace="workspace", edit_table="edits")
    for n, f in saved.items():
        setattr(ks, n, tagged(f, kinds[n]))
    try:
        c.install()
        mod.fused_sample(logits, input_ids=ids, seed=1, offset=0, **kw, **extra)
    finally:
        for n, f in saved.items():
            setattr(ks, n, f)
    return c


def measure_speculative(mod, B, K, V, kw, with_q, seed=0):
    """Counter for one speculative_sample() call on one row b (K + 1 target rows), the
    launches planned for B (K + 1) rows."""
    import functools
    import gpu_sampler
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(1, K + 1, V, generator=gen) * 3
    drafts = torch.randint(0, V, (1, K), generator=gen)
    q = torch.softmax(target[:, :K] * 0.8, -1) if with_q else None
    c = Counter()
    c.tag(target, "logits")
    saved = mod.fused_sample, mod.sampling._alloc, mod.sampling._workspace
    mod.fused_sample = functools.partial(saved[0], plan_batch=B * (K + 1))
    for n, kind in (("_alloc", "outputs"), ("_workspace", "workspace")):
        orig = getattr(mod.sampling, n)
        setattr(mod.sampling, n, lambda *a, _o=orig, _k=kind: _tag(c, _o(*a), _k))
    try:
        c.install()
        gpu_sampler.speculative_sample(target, drafts, q, seed=1, check=False, backend="triton",
                                       **kw)
    finally:
        mod.fused_sample, mod.sampling._alloc, mod.sampling._workspace = saved
    return c


def _tag(c, t, kind):
    c.tag(t, kind)
    return t


def speculative_table(mod, K, cases, base):
    print(f"| B | K | V | config | draft | passes over target logits | workspace B/row | "
          f"outputs stored B/row | programs/row | launches |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for B, V in cases:
        for name, kw in (("T0.7 k50 p0.9", dict(temperature=0.7, top_k=50, top_p=0.9)),
                         ("T0.7 p0.9", TOP_P)):
            for with_q in (False, True):
                c = measure_speculative(mod, B, K, V, kw, with_q)
                (ti.InterpreterBuilder.create_masked_load,
                 ti.InterpreterBuilder.create_masked_store, ti.GridExecutor.__call__) = base
                rows = K + 1
                print(f"| {B} | {K} | {V} | {name} | {'q' if with_q else 'one-hot'} | "
                      f"{c.total('logits', 'load') / (rows * V * 4):.3f} | "
                      f"{c.total('workspace') / rows:,.0f} | "
                      f"{c.total('outputs', 'store') / rows:,.0f} | "
                      f"{programs_per_row(c, rows)} | {len(c.launches)} |", flush=True)


def programs_per_row(c, rows):
    per = 0
    for name, grid in c.launches:
        g = tuple(grid) + (1, 1)
        per = max(per, g[0] * g[1] * g[2] // rows)
    return per


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=None, help="a kernels/ package folder (default: ours)")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--cases", default=None, help="e.g. 1,32000;64,128256")
    ap.add_argument("--cd", action="store_true", help="contrastive decoding: amateur logits too")
    ap.add_argument("--edits", action="store_true",
                    help="a request's token mask and 20 logit-bias entries per row")
    ap.add_argument("--top-n", type=int, default=0, help="top-N raw logprobs in the same call")
    ap.add_argument("--speculative", type=int, default=0, metavar="K",
                    help="speculative_sample() with K drafts per row (this checkout only)")
    a = ap.parse_args(argv)
    mod = load_kernels(a.kernels)
    cases = CASES if a.cases is None else [tuple(map(int, s.split(","))) for s in a.cases.split(";")]
    base = (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
            ti.GridExecutor.__call__)
    if a.speculative:
        print(f"# speculative_sample traffic of {a.label}: bytes per target row")
        return speculative_table(mod, a.speculative, cases, base)
    print(f"# traffic of {a.label}: interpreter runs {a.rows} rows per case, bytes per row")
    am_col = (" passes over amateur |" if a.cd else "") + (" edit table B/row |" if a.edits
                                                           else "")
    print("| B | V | config | L | passes over logits |" + am_col + " history B/row | "
          "workspace B/row (ld+st) | programs/row | launches |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * (a.cd + a.edits))
    for B, V in cases:
        for name, kw, L in (("rp1.2 T0.7 k50 p0.9", FULL, 128), ("rp1.2 T0.7 k50 p0.9", FULL, 4096),
                            ("T0.7 p0.9", TOP_P, 0), ("rp1.2 greedy", GREEDY, 128)):
            rows = min(B, a.rows)
            c = measure(mod, B, V, L, kw, rows, cd=a.cd, with_edits=a.edits, top_n=a.top_n)
            (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
             ti.GridExecutor.__call__) = base
            passes = c.total("logits", "load") / (rows * V * 4)
            am = f" {c.total('amateur', 'load') / (rows * V * 4):.3f} |" if a.cd else ""
            am += f" {c.total('edits', 'load') / rows:,.0f} |" if a.edits else ""
            hist = c.total("history") / rows
            ws = c.total("workspace") / rows
            print(f"| {B} | {V} | {name} | {L} | {passes:.3f} |{am} {hist:,.0f} | {ws:,.0f} | "
                  f"{programs_per_row(c, rows)} | {len(c.launches)} |", flush=True)


if __name__ == "__main__":
    main()
