"""Issue 17's workload table measured on a CUDA device: every setting of bench/rows.py on every
row kind, at (1, 128256) and (64, 128256) in fp32, bf16 for two row kinds at (64, 128256),
and (256, 151936) for the settings that take the band read; greedy (a scalar T = 0 and a
tensor T's zeros: stage 1's greedy blocks) at (64, 128256) and (256, 151936).

Per case it checks, then times:
- the token is in the kept set of the torch twin's distribution (exact support check), and how
  many rows draw the twin's token for the same seed and offset (same noise, same kept set);
- tokens and logprobs are bit-identical at chunk counts 1 and 5 and in a two-row sub-batch;
- GPU time per ``gpu_sampler.sample`` call (check=False, per-row seed/offset tensors) from a
  CUDA-graph replay, and the kernels' GPU time per call (torch.profiler, eager).

    python bench/gpu_workloads.py --out DIR               # DIR/gpu_workloads.{json,md}
    python bench/gpu_workloads.py --warm --part 2/6 --out DIR  # checks of every 6th case, no timing
    TRITON_INTERPRET=1 python bench/gpu_workloads.py --device cpu --smoke --out /tmp/x
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rows import KINDS, SETTINGS, mixed_kwargs, row_logits  # noqa: E402

import gpu_sampler  # noqa: E402
from gpu_sampler.kernels.sampling import fused_sample  # noqa: E402

TUNED = (dict(repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9), 128)
BAND = ("T0.6 p0.9", "T1.0 p0.95", "T1.0 minp0.05", "mixed")


def cases(smoke=False):
    """(B, V, dtype name, kind, setting name) in the order they run."""
    if smoke:
        return [(3, 4099, "float32", k, s) for k in ("flat", "sigma3")
                for s in ("T1.0 p0.95", "mixed", "tuned")] + [(3, 4099, "float32", "sigma3",
                                                                 "greedy per-row")]
    out = [(B, 128256, "float32", k, s) for B in (1, 64) for s in list(SETTINGS) + ["tuned"]
           for k in KINDS]
    out += [(64, 128256, "bfloat16", k, s) for s in SETTINGS for k in ("sigma3", "flat")]
    out += [(256, 151936, "float32", k, s) for s in BAND + ("tuned",) for k in ("sigma3", "flat")]
    # greedy rows as greedy blocks (stats._block_greedy): a scalar T = 0 and a tensor T's zeros
    out += [(B, V, "float32", "sigma3", s) for B, V in ((64, 128256), (256, 151936))
            for s in ("greedy", "greedy per-row")]
    return out


def _setting(name, B, device):
    if name == "greedy per-row":  # a tensor T (serving stacks, torch.compile): GREEDY_ROWS
        return dict(temperature=torch.zeros(B, device=device)), 0
    kw, L = TUNED if name == "tuned" else SETTINGS[name]
    if kw is None:
        kw = {n: v.to(device) for n, v in mixed_kwargs(B).items()}
    return kw, L


def _graph(fn, n=50):
    """(GPU µs per replay of fn captured in a CUDA graph, fn's outputs as the replays leave
    them): 3 warm-up calls on a side stream, one capture, one replay, n timed replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n * 1e3, out


def _graph_us(fn, n=50):
    return _graph(fn, n)[0]


def _kernels(fn, calls=5):
    """{kernel: [launches, GPU µs] per call} of fn's eager calls (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if dev and e.count:
            out[e.key.split("(")[0][:40]] = [round(e.count / calls, 2), round(dev / calls, 2)]
    return out


def _checks(x, ids, seed, off, kw, device):
    """Support, agreement with the twin, and invariance to the chunk count and the batch."""
    call = dict(input_ids=ids, seed=seed, offset=off, **kw)
    tok, lp = gpu_sampler.sample(x, backend="triton", check=False, return_logprobs=True, **call)
    ttok = gpu_sampler.sample(x, backend="torch", **call)
    probs = gpu_sampler.sampling_distribution(x, backend="torch", input_ids=ids,
                                              **{k: v for k, v in kw.items()})
    B = x.shape[0]
    res = dict(in_twin_support=int((probs.gather(1, tok[:, None]) > 0).sum()), rows=B,
               tokens_equal_twin=int((tok == ttok).sum()))
    inv = True
    for chunks in (1, 5):
        t2, l2 = fused_sample(x, chunks=chunks, **call)
        inv &= bool(torch.equal(t2, tok) and torch.equal(l2, lp))
    if B > 1:
        r = torch.tensor([B - 1, 0], device=device)
        sub = {k: (v[r] if isinstance(v, torch.Tensor) and v.dim() == 1 else v)
               for k, v in kw.items()}
        t3, l3 = fused_sample(x[r], input_ids=None if ids is None else ids[r], seed=seed[r],
                              offset=off[r], **sub)
        inv &= bool(torch.equal(t3, tok[r]) and torch.equal(l3, lp[r]))
    res["bit_identical_chunks_1_5_and_sub_batch"] = inv
    return res, call


def one(B, V, dtype, kind, name, device, warm=False, smoke=False, profile=True):
    x = row_logits(kind, B, V).to(device=device, dtype=getattr(torch, dtype))
    kw, L = _setting(name, B, device)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (B, L), generator=g).to(device) if L else None
    seed = torch.arange(B, device=device, dtype=torch.int64) + 11
    off = torch.full((B,), 5, device=device, dtype=torch.int64)
    row = dict(B=B, V=V, dtype=dtype, kind=kind, setting=name)
    res, call = _checks(x, ids, seed, off, kw, device)
    row.update(res)
    if not (warm or smoke):
        fn = lambda: gpu_sampler.sample(x, check=False, **call)  # noqa: E731
        row["graph_us"] = round(_graph_us(fn), 2)
        if profile:
            row["kernels_eager"] = _kernels(fn)
    return row


def markdown(rows, info):
    lines = [f"# gpu_workloads on {info['gpu']}", "", ", ".join(f"{k} {v}" for k, v in
             info.items() if k != "gpu"), "",
             "| (B, V) | dtype | setting | kind | graph µs | in twin support | = twin token | "
             "bit-identical (chunks 1, 5, sub-batch) |", "|---|---|---|---|---:|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| ({r['B']}, {r['V']}) | {r['dtype']} | {r['setting']} | {r['kind']} "
                         f"| error: {r['error']} | | | |")
            continue
        lines.append(f"| ({r['B']}, {r['V']}) | {r['dtype']} | {r['setting']} | {r['kind']} | "
                     f"{r.get('graph_us', '–')} | {r['in_twin_support']}/{r['rows']} | "
                     f"{r['tokens_equal_twin']}/{r['rows']} | "
                     f"{r['bit_identical_chunks_1_5_and_sub_batch']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=".")
    ap.add_argument("--warm", action="store_true", help="checks only, no timing (compiles)")
    ap.add_argument("--part", default="1/1", help="i/n: every n-th case from the i-th")
    ap.add_argument("--smoke", action="store_true", help="small shapes, no timing (CPU)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop profiling past this")
    a = ap.parse_args(argv)
    i, n = (int(v) for v in a.part.split("/"))
    todo = cases(a.smoke)[i - 1::n]
    if a.warm:  # the parts start on different settings, so they compile different kernels first
        k = (i - 1) * len(todo) // n
        todo = todo[k:] + todo[:k]
    t0, rows = time.time(), []
    for B, V, dtype, kind, name in todo:
        try:
            r = one(B, V, dtype, kind, name, a.device, a.warm, a.smoke,
                    profile=time.time() - t0 < a.budget_s)
        except Exception as e:  # one failing case must not lose the others
            r = dict(B=B, V=V, dtype=dtype, kind=kind, setting=name,
                     error=f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "kernels_eager"}), flush=True)
        write(a, rows, time.time() - t0, f"-warm-{i}of{n}" if a.warm else "")
    return 0


def write(a, rows, seconds, suffix):
    """Both files, rewritten after every case: a run cut off by its timeout keeps what it did."""
    import triton
    info = dict(gpu=torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                torch=torch.__version__, triton=triton.__version__, seconds=round(seconds, 1))
    os.makedirs(a.out, exist_ok=True)
    name = "gpu_workloads" + suffix
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump(dict(info=info, rows=rows), f, indent=1)
    with open(os.path.join(a.out, name + ".md"), "w") as f:
        f.write(markdown(rows, info))


if __name__ == "__main__":
    sys.exit(main())
