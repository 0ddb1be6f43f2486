"""Vocab-parallel sampling vs gathering the logits, over gloo ranks on this machine.

    nice -n 10 .venv/bin/python bench/distributed_bench.py [--quick] [--out results.json]

For each world size (2, 4), shape and configuration, every rank holds a [B, V / W] shard and:
  gsd     gpu_sampler.distributed.sample(shard, ...)
  gather  dist.all_gather of the shards, torch.cat, gpu_sampler.sample(full, backend="torch")
Reported per call: bytes sent per rank (payload x (W - 1), what a ring all_gather sends; the
same rule for both), collectives, and the median wall time over `reps` calls on rank 0 (ranks
start together after a barrier). Before timing, both give the same tokens (checked).
"""
import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gpu_sampler
from gpu_sampler import distributed as gsd

SHAPES = [(8, 128256), (64, 128256), (256, 151936)]
CONFIGS = {
    "rp1.2-T0.7-k50-p0.9": dict(repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9),
    "T0.7-p0.9": dict(temperature=0.7, top_p=0.9),
}


def _shard(full, rank, world):
    V = full.shape[1]
    base, extra = divmod(V, world)
    start = rank * base + min(rank, extra)
    return full[:, start:start + base + (1 if rank < extra else 0)].contiguous(), start


def _gather_then_sample(shard, group_size, kw):
    parts = [torch.empty_like(shard) for _ in range(group_size)]
    dist.all_gather(parts, shard)
    return gpu_sampler.sample(torch.cat(parts, 1), backend="torch", **kw)


def _timed(fn, reps):
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(rank, world, port, shapes, reps, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rows = []
    for B, V in shapes:
        gen = torch.Generator().manual_seed(B)
        full = torch.randn(B, V, generator=gen) * 3
        ids = torch.randint(0, V, (B, 128), generator=gen)
        shard, start = _shard(full, rank, world)
        for name, cfg in CONFIGS.items():
            kw = dict(cfg, input_ids=ids, seed=1, offset=torch.arange(B))
            a = gsd.sample(shard, vocab_start=start, vocab_size=V, **kw)
            b = _gather_then_sample(shard, world, kw)
            assert torch.equal(a, b), (B, V, name)
            before = dict(gsd.stats)
            gsd.sample(shard, vocab_start=start, vocab_size=V, **kw)
            sent = gsd.stats["bytes_sent"] - before["bytes_sent"]
            calls = gsd.stats["collectives"] - before["collectives"]
            esc = gsd.stats["escalations"] - before["escalations"]
            t_gsd = _timed(lambda: gsd.sample(shard, vocab_start=start, vocab_size=V, **kw), reps)
            t_gat = _timed(lambda: _gather_then_sample(shard, world, kw), reps)
            if rank == 0:
                rows.append(dict(world=world, B=B, V=V, config=name, gsd_bytes=sent,
                                 gather_bytes=shard.numel() * 4 * (world - 1),
                                 gsd_collectives=calls, gsd_escalations=esc,
                                 gsd_ms=t_gsd * 1e3, gather_ms=t_gat * 1e3))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="(8, 128256) only, 2 reps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    reps = 2 if args.quick else 5
    ctx = mp.get_context("spawn")
    results = []
    for world in (2, 4):
        q = ctx.Queue()
        port = _port()
        procs = [ctx.Process(target=_worker, args=(r, world, port, shapes, reps, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        results += q.get()
        for p in procs:
            p.join()
    print(f"{'W':>2} {'B':>4} {'V':>7} {'config':<20} {'gsd bytes':>11} {'gather bytes':>13} "
          f"{'ratio':>7} {'coll':>4} {'gsd ms':>8} {'gather ms':>9} {'speedup':>7}")
    for r in results:
        print(f"{r['world']:>2} {r['B']:>4} {r['V']:>7} {r['config']:<20} {r['gsd_bytes']:>11,} "
              f"{r['gather_bytes']:>13,} {r['gather_bytes'] / r['gsd_bytes']:>7.1f} "
              f"{r['gsd_collectives']:>4} {r['gsd_ms']:>8.1f} {r['gather_ms']:>9.1f} "
              f"{r['gather_ms'] / r['gsd_ms']:>7.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(machine=os.uname().nodename, cpus=os.cpu_count(), rows=results), f,
                      indent=1)


if __name__ == "__main__":
    main()
