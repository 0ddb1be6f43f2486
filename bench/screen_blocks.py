"""How many of the gathers' blocks score their tokens' Gumbel noise (kernels/band.py
_screened_winner, kernels/second.py _gather_block), counted under the interpreter at the GPU's
geometry (1024-token blocks), on bench/rows.py's row kinds, with B = 64's chunk plan (where the
launcher screens): the rest skip the noise's two logs a token. Also the rows whose winner fell
below the screen's bound (the finishes' re-draw: logits read by a finish).

    python bench/screen_blocks.py                # T 1.0 p 0.95, T 0.6 p 0.9, T 1.0 min-p 0.05
    python bench/screen_blocks.py --rows 4 --kinds flat
"""
import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from triton.runtime import interpreter as ti  # noqa: E402

from rows import KINDS, SETTINGS, row_logits  # noqa: E402
from traffic import Counter, load_kernels  # noqa: E402


def count(mod, kind, setting, rows, V):
    """(blocks scored, blocks the gathers read, bytes of logits the finishes read, tokens):
    the band gather's blocks and the second read's (min-p rows)."""
    band, second, ks = mod.band, mod.second, mod.sampling
    x = row_logits(kind, rows, V)
    kw = dict(SETTINGS[setting][0], seed=torch.arange(rows) + 11, offset=torch.arange(rows))
    scored = [0]

    def counting(inner, caller):
        def counted(u):
            # the gathers' blocks only (the band finish's tiles call it too)
            scored[0] += sys._getframe(1).f_code.co_name == caller
            return inner(u)
        return counted

    c = Counter()
    c.tag(x, "logits")
    base = (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
            ti.GridExecutor.__call__)
    inner = (band._gumbel_of, second._gumbel_of)
    band._gumbel_of = counting(inner[0], "_screened_winner")
    second._gumbel_of = counting(inner[1], "_gather_block")
    # the launcher screens above SCREEN_PROGRAMS gather programs (B C): B = 64's plan is, the
    # interpreter's few rows are not
    screen, ks.SCREEN_PROGRAMS = ks.SCREEN_PROGRAMS, 0
    try:
        c.install()
        tok = ks.fused_sample(x, tile=1024, chunks=ks.plan(64, V, tile=1024)["C"], **kw)[0]
    finally:
        band._gumbel_of, second._gumbel_of = inner
        ks.SCREEN_PROGRAMS = screen
        (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
         ti.GridExecutor.__call__) = base
    names = [n for n, _ in c.launches]

    def logits_bytes(*launches):
        return sum(c.bytes.get((i, "logits", "load"), 0) for i, n in enumerate(names)
                   if n in launches)

    nt = (V + 1023) // 1024
    return (scored[0], round(logits_bytes("_band_gather_kernel", "_gather_kernel") / (4 * V) * nt),
            logits_bytes("_band_finish_kernel", "_finish_kernel"), tok)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--V", type=int, default=128256)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--settings", default="T1.0 p0.95;T0.6 p0.9;T1.0 minp0.05")
    a = ap.parse_args(argv)
    mod = load_kernels(None)
    print(f"| setting | row kind | blocks scored / gathered ({a.rows} rows, V = {a.V}) "
          "| finish's logits bytes |")
    print("|---|---|---|---|")
    for setting in a.settings.split(";"):
        for kind in a.kinds.split(","):
            n, g, fin, _ = count(mod, kind, setting, a.rows, a.V)
            share = f"{n} / {g} ({100 * n / g:.0f}%)" if g else "no second read"
            print(f"| {setting} | {kind} | {share} | {fin} |", flush=True)


if __name__ == "__main__":
    main()
