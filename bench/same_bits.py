"""The same-bits comparison kernel changes are checked with (interpreter, no GPU): 56 calls,
4 row kinds x 7 settings (T 1.0, T 0.6 p 0.9, T 1.0 p 0.95, T 1.0 min-p 0.05, T 1.0 k 50,
the Qwen defaults with a 128-token history, the mixed serving batch) x 2 seeds, B = 4 (5 for
the mixed batch), V = 32000, the default geometry; saves every (tokens, logprobs) and compares
them with torch.equal against a saved file.

    python bench/same_bits.py --save /tmp/new.pt --against /tmp/old.pt
    python bench/same_bits.py --kernels /tmp/old_checkout/kernels --save /tmp/old.pt
    python bench/same_bits.py --screen-all --save /tmp/s.pt --against /tmp/old.pt

--kernels loads another checkout's kernels folder (a git worktree) as the package; ~2 min a run
with the interpreter shortcut. --tile 1024 runs the GPU's block size (the interpreter's default
2048 takes other code paths in places, e.g. common._kept_slots' plain cumsum). --screen-all
screens the gathers' draw at every batch (sampling.SCREEN_PROGRAMS = 0), where the launcher
would not at these small batches.
"""
import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from rows import KINDS, SETTINGS, mixed_kwargs, row_logits  # noqa: E402
from traffic import load_kernels  # noqa: E402

NAMES = ("T1.0", "T0.6 p0.9", "T1.0 p0.95", "T1.0 minp0.05", "T1.0 k50",
         "T0.7 k20 p0.8 rep1.05", "mixed")


def run(ks, V=32000, tile=None):
    """{(kind, setting, seed): (tokens, logprobs)} of every case (tile: the block size; None is
    the interpreter's default, 2048)."""
    out = {}
    for kind in KINDS:
        for name in NAMES:
            for seed in (0, 1):
                B = 5 if name == "mixed" else 4
                x = row_logits(kind, B, V, seed=seed)
                kw, L = (mixed_kwargs(B), 0) if name == "mixed" else (dict(SETTINGS[name][0]),
                                                                       SETTINGS[name][1])
                if L:
                    g = torch.Generator().manual_seed(seed)
                    kw["input_ids"] = torch.randint(0, V, (B, L), generator=g)
                if tile is not None:
                    kw["tile"] = tile
                tok, lp = ks.fused_sample(x, seed=1234 + seed, offset=7, **kw)[:2]
                out[(kind, name, seed)] = (tok.clone(), lp.clone())
                print(kind, name, seed, tok.tolist(), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--save", required=True)
    ap.add_argument("--against", default=None)
    ap.add_argument("--screen-all", action="store_true")
    ap.add_argument("--tile", type=int, default=None,
                    help="block size (1024: the GPU's, whose packed slot scans 2048 skips)")
    a = ap.parse_args(argv)
    ks = load_kernels(a.kernels).sampling
    if a.screen_all:
        ks.SCREEN_PROGRAMS = 0
    out = run(ks, tile=a.tile)
    torch.save(out, a.save)
    if a.against:
        ref = torch.load(a.against)
        bad = [k for k in out if not (torch.equal(out[k][0], ref[k][0])
                                      and torch.equal(out[k][1], ref[k][1]))]
        print("differ:", bad if bad else "none", f"({len(out)} cases)")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
