"""Launch-geometry sweep on a CUDA device: GPU time per fused_sample call (CUDA-graph replay)
for stage 1's tile and warps, over the settings and shapes of issue 17, against the default
plan in the same run. Tokens are compared with the default geometry's.

    python bench/gpu_sweep.py --out DIR                  # DIR/gpu_sweep.json
    python bench/gpu_sweep.py --warm --geom 2048,4       # compile one geometry's variants only
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_workloads import _graph_us, _setting  # noqa: E402
from rows import row_logits  # noqa: E402

from gpu_sampler.kernels.sampling import fused_sample  # noqa: E402

# (tile, warps); None: the plan's. plan() clamps the tile to 1024 (its counts fit 11 bits), so the
# 2048 rows rerun 1024: a repeat of the baseline in the same run, i.e. its noise
GEOMS = [(None, None), (1024, 8), (2048, 4), (2048, 8), (512, 4)]
SETTINGS = [("greedy", "sigma3"), ("T1.0", "sigma3"), ("T0.6 p0.9", "sigma3"),
            ("T1.0 p0.95", "flat"), ("T1.0 minp0.05", "flat"), ("tuned", "sigma3")]
SHAPES = [(1, 128256), (64, 128256), (256, 151936)]


def _call(B, V, name, kind):
    x = row_logits(kind, B, V).cuda()
    kw, L = _setting(name, B, "cuda")
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (B, L), generator=g).cuda() if L else None
    seed = torch.arange(B, device="cuda", dtype=torch.int64) + 11
    off = torch.full((B,), 5, device="cuda", dtype=torch.int64)
    return lambda tile, warps: fused_sample(x, input_ids=ids, seed=seed, offset=off, tile=tile,
                                            num_warps=warps, **kw)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--geom", default=None, help="tile,warps: this geometry only")
    a = ap.parse_args(argv)
    geoms = GEOMS
    if a.geom:
        t, w = (int(v) for v in a.geom.split(","))
        geoms = [(t, w)]
    rows, t0 = [], time.time()
    for B, V in SHAPES:
        for name, kind in SETTINGS:
            f = _call(B, V, name, kind)
            ref = f(None, None)[0]
            for tile, warps in geoms:
                r = dict(B=B, V=V, setting=name, kind=kind, tile=tile, warps=warps)
                try:
                    tok = f(tile, warps)[0]
                    r["tokens_equal_default"] = int((tok == ref).sum())
                    if not a.warm:
                        r["graph_us"] = round(_graph_us(lambda: f(tile, warps)), 2)
                except Exception as e:  # a geometry the launcher refuses is a finding too
                    r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(r)
                print(json.dumps(r), flush=True)
            if not a.warm:
                os.makedirs(a.out, exist_ok=True)
                with open(os.path.join(a.out, "gpu_sweep.json"), "w") as fh:
                    json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows,
                                   seconds=round(time.time() - t0, 1)), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
