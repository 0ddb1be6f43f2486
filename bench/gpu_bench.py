"""Plain timing script (no pytest-benchmark): gpu_sampler.sample vs the HF chain vs naive torch.

One sampling step, rp 1.2 / T 0.7 / top-k 50 / top-p 0.9 with input_ids [B, 128], on fp32
logits of several (B, V). Times are medians of N calls measured with CUDA events (wall clock
with synchronize on CPU). Effective bandwidth = logits bytes read once / time; the device's
copy bandwidth (clone of a 1 GiB buffer, counted as read + write) is measured in the same run
for comparison: it is the ceiling a memory-bound sampler can approach.

    python bench/gpu_bench.py --out bench/results/gpu-2026-01-01       # CUDA
    python bench/gpu_bench.py --device cpu --quick --out /tmp/x         # smoke run

Writes gpu_bench.json and gpu_bench.md into --out.
"""
import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_sampler  # noqa: E402

PARAMS = dict(repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9)
SHAPES = [(1, 32000), (8, 32000), (1, 128256), (64, 128256), (128, 131072), (256, 151936),
          (1, 262144), (64, 262144)]
QUICK_SHAPES = [(1, 32000), (8, 32000), (4, 128256)]
HISTORY = 128


def hf_chain(logits, ids):
    from transformers.generation.logits_process import (
        LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
        TopKLogitsWarper, TopPLogitsWarper)
    procs = LogitsProcessorList([
        RepetitionPenaltyLogitsProcessor(PARAMS["repetition_penalty"]),
        TemperatureLogitsWarper(PARAMS["temperature"]), TopKLogitsWarper(PARAMS["top_k"]),
        TopPLogitsWarper(PARAMS["top_p"])])
    return torch.multinomial(torch.softmax(procs(ids, logits.float()), -1), 1).squeeze(1)


def naive(logits, ids):
    """A straightforward torch version: the same math written inline, one sort for top-p."""
    x = logits.float()
    g = x.gather(1, ids)
    x = x.scatter(1, ids, torch.where(g < 0, g * PARAMS["repetition_penalty"],
                                      g / PARAMS["repetition_penalty"]))
    x = x / PARAMS["temperature"]
    kth = x.topk(PARAMS["top_k"], dim=1).values[:, -1:]
    x = x.masked_fill(x < kth, float("-inf"))
    srt, idx = x.sort(dim=1, descending=True)
    p = srt.softmax(1)
    drop = (p.cumsum(1) - p) >= PARAMS["top_p"]  # mass strictly above >= top_p
    x = x.scatter(1, idx, srt.masked_fill(drop, float("-inf")))
    return torch.multinomial(x.softmax(1), 1).squeeze(1)


def ours(logits, ids):
    return gpu_sampler.sample(logits, input_ids=ids, **PARAMS)


def median_seconds(fn, n, device, warmup=3):
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    else:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def copy_bandwidth(device, nbytes):
    """Bytes moved per second by ``clone`` of an nbytes buffer (read + write)."""
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    s = median_seconds(lambda: buf.clone(), 10 if device.type == "cuda" else 3, device)
    del buf
    return 2 * nbytes / s


def versions(device):
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "cuda": torch.version.cuda, "gpu_sampler": gpu_sampler.__version__,
         "device": str(device), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except Exception:  # report what is there; the HF provider will fail loudly if needed
        pass
    try:
        import triton
        v["triton"] = triton.__version__
    except Exception:
        pass
    if device.type == "cuda":
        v["gpu"] = torch.cuda.get_device_name(device)
    return v


def run(device, shapes, n, copy_bytes):
    device = torch.device(device)
    info = versions(device)
    info["copy_GBps"] = copy_bandwidth(device, copy_bytes) / 1e9
    providers = {"gpu_sampler": ours, "hf": hf_chain, "naive": naive}
    rows = []
    g = torch.Generator().manual_seed(0)
    for B, V in shapes:
        logits = (torch.randn(B, V, generator=g) * 3).to(device)
        ids = torch.randint(0, V, (B, HISTORY), generator=g).to(device)
        row = {"B": B, "V": V}
        for name, fn in providers.items():
            try:
                s = median_seconds(lambda: fn(logits, ids), n, device)
            except Exception as e:  # one failing provider should not lose the others
                row[name + "_error"] = f"{type(e).__name__}: {e}"[:200]
                continue
            row[name + "_us"] = s * 1e6
            row[name + "_GBps"] = logits.numel() * logits.element_size() / s / 1e9
        for name in ("hf", "naive"):
            if name + "_us" in row and "gpu_sampler_us" in row:
                row[f"{name}/gpu_sampler"] = row[name + "_us"] / row["gpu_sampler_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del logits, ids
    return {"info": info, "params": PARAMS, "history": HISTORY, "rows": rows}


def markdown(res):
    info = res["info"]
    lines = ["# gpu_bench: one sampling step", "",
             f"- device: {info.get('gpu', info['device'])}; torch {info['torch']}, "
             f"triton {info.get('triton', '-')}, transformers {info.get('transformers', '-')}, "
             f"cuda {info['cuda']}; {info['date']}",
             f"- rp 1.2, T 0.7, top-k 50, top-p 0.9, input_ids [B, {res['history']}], fp32 logits",
             f"- measured copy bandwidth (clone, read + write): {info['copy_GBps']:.4g} GB/s; "
             "effective GB/s below = logits bytes read once / time", "",
             "| B | V | gpu_sampler µs | GB/s | hf µs | naive µs | hf/gpu_sampler | "
             "naive/gpu_sampler |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(r, k, fmt):
        return format(r[k], fmt) if k in r else "err"
    for r in res["rows"]:
        lines.append(f"| {r['B']} | {r['V']} | {f(r, 'gpu_sampler_us', '.1f')} | "
                     f"{f(r, 'gpu_sampler_GBps', '.4g')} | {f(r, 'hf_us', '.1f')} | "
                     f"{f(r, 'naive_us', '.1f')} | {f(r, 'hf/gpu_sampler', '.1f')} | "
                     f"{f(r, 'naive/gpu_sampler', '.1f')} |")
    errs = [(r["B"], r["V"], k, v) for r in res["rows"] for k, v in r.items() if k.endswith("_error")]
    for B, V, k, v in errs:
        lines.append(f"\n- ({B}, {V}) {k[:-6]}: {v}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=None, help="timed calls per case")
    ap.add_argument("--out", default="bench/results/gpu_bench")
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_bench.py: error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    cuda = a.device.startswith("cuda")
    shapes = QUICK_SHAPES if a.quick else SHAPES
    n = a.n or (50 if cuda else 3)
    res = run(a.device, shapes, n, copy_bytes=(1 << 30) if cuda else (64 << 20))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_bench.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (out / "gpu_bench.md").write_text(md)
    print(md)
    print(f"wrote {out / 'gpu_bench.json'} and {out / 'gpu_bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
