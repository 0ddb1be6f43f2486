"""Where a sample() call's time goes on a CUDA device (run by bench/gpu_check.sh).

Per (B, V) and setting it records:
- host-bound time per call, eager, with check=True (the default) and check=False: wall clock
  over N back-to-back calls, synchronised once at the end;
- GPU time per call from a CUDA-graph replay of a check=False call (per-row seed/offset
  tensors): the kernels alone, without Python or launch overhead; the replayed tokens are
  compared with eager tokens for the same seed and offset;
- the kernels one call launches and their GPU time, and whether the call synchronises
  (cudaStreamSynchronize / cudaMemcpy device-to-host seen by torch.profiler).

    python bench/gpu_profile.py --out bench/results/gpu-<date>
Writes gpu_profile.json and gpu_profile.md into --out.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_workloads import _graph as _graph_replay  # noqa: E402

import gpu_sampler  # noqa: E402

SHAPES = [(1, 32000), (1, 128256), (64, 128256), (256, 151936)]
SETTINGS = {
    "tuned rp1.2 T0.7 k50 p0.9": dict(repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9),
    "greedy": dict(temperature=0.0),
    "T1.0": dict(temperature=1.0),
    "T0.6 p0.9": dict(temperature=0.6, top_p=0.9),
    "T1.0 p0.95": dict(temperature=1.0, top_p=0.95),
    "T1.0 minp0.05": dict(temperature=1.0, min_p=0.05),
}
SYNC_OPS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy ", "cudaMemcpyAsync")


def _inputs(B, V, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(B, V, device="cuda", generator=g) * 3
    ids = torch.randint(0, V, (B, 128), device="cuda", generator=g)
    seeds = torch.arange(B, device="cuda", dtype=torch.int64) + 11
    offset = torch.full((B,), 5, device="cuda", dtype=torch.int64)
    return logits, ids, seeds, offset


def _host_us(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def _graph(fn, n=50):
    """(GPU us per replay, tokens of one replay) or (None, error text)."""
    try:
        us, out = _graph_replay(fn, n)
    except Exception as e:  # the finding is the error itself
        return None, f"{type(e).__name__}: {str(e)[:200]}"
    return us, out[0].clone()


def _profile(fn, calls=5):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels, syncs = {}, 0
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if any(e.key.startswith(s) for s in SYNC_OPS):
            syncs += e.count
        elif dev and e.count and not e.key.startswith(("cuda", "aten::", "Memcpy", "Memset")):
            kernels[e.key[:60]] = (e.count / calls, dev / calls)
    return kernels, syncs / calls


def one_case(B, V, name, kw):
    logits, ids, seeds, offset = _inputs(B, V)
    call = dict(input_ids=ids, seed=seeds, offset=offset, **kw)
    eager = gpu_sampler.sample(logits, check=False, **call)
    row = {"B": B, "V": V, "setting": name,
           "host_us_check": _host_us(lambda: gpu_sampler.sample(logits, **call)),
           "host_us_nocheck": _host_us(lambda: gpu_sampler.sample(logits, check=False, **call))}
    gpu_us, out = _graph(lambda: (gpu_sampler.sample(logits, check=False, **call),))
    row["graph_gpu_us"] = gpu_us
    row["graph_error"] = out if gpu_us is None else None
    row["graph_tokens_equal_eager"] = None if gpu_us is None else bool(torch.equal(out, eager))
    kernels, syncs = _profile(lambda: gpu_sampler.sample(logits, check=False, **call))
    row["kernels"] = {k: {"launches": c, "gpu_us": round(t, 2)} for k, (c, t) in
                      sorted(kernels.items(), key=lambda kv: -kv[1][1])}
    row["launches_per_call"] = sum(c for c, _ in kernels.values())
    row["syncs_per_call_nocheck"] = syncs
    row["read_once_GBps_graph"] = (logits.numel() * 4 / (gpu_us * 1e-6) / 1e9) if gpu_us else None
    return row


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def markdown(rows, info):
    lines = [f"# sample() on {info['gpu']}", "", f"torch {info['torch']}, triton {info['triton']}",
             "", "| (B, V) | setting | eager check=True us | eager check=False us | graph GPU us "
             "| GB/s (one read, graph) | launches | syncs (check=False) | graph == eager |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| ({r['B']}, {r['V']}) | {r['setting']} | {r['host_us_check']:.1f} | "
                     f"{r['host_us_nocheck']:.1f} | {_fmt(r['graph_gpu_us'], '.1f')} | "
                     f"{_fmt(r['read_once_GBps_graph'], '.0f')} | {r['launches_per_call']:.0f} | "
                     f"{r['syncs_per_call_nocheck']:.0f} | {r['graph_tokens_equal_eager']} |")
    lines += ["", "Kernels per call (GPU us, from torch.profiler):", ""]
    for r in rows:
        ks = ", ".join(f"{k} {v['gpu_us']}" for k, v in r["kernels"].items())
        lines.append(f"- ({r['B']}, {r['V']}) {r['setting']}: {ks}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import triton
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__}
    rows = []
    for B, V in SHAPES:
        for name, kw in SETTINGS.items():
            rows.append(one_case(B, V, name, kw))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "kernels"}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_profile.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    (out / "gpu_profile.md").write_text(markdown(rows, info))


if __name__ == "__main__":
    main()
