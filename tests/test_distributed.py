"""gpu_sampler.distributed on gloo: ranks are spawned with torch.multiprocessing.

Each test launches one process group (world 2, 3 or 4) and runs a batch of checks in it
(spawn startup dominates, so checks are grouped). Every check compares with single-process
``gpu_sampler.sample(torch.cat(shards, 1), backend="torch")``. A hang fails the test: the
group has a 60 s collective timeout and the parent waits at most _WAIT seconds.
"""
import datetime
import importlib.util
import math
import os
import pathlib
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gpu_sampler
from gpu_sampler import distributed as gsd

_WAIT = 240
_ROOT = pathlib.Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- harness

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_GROUP = None  # the process group of the running check (a subgroup of WORLD)


def _worker(rank, world, port, plan, q):
    global _GROUP
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        # new_group is collective over WORLD: every rank creates every group, in one order.
        groups = {n: dist.new_group(list(range(n))) for n in sorted({n for n, _ in plan})}
        for n, name in plan:
            if rank >= n:
                continue
            _GROUP = groups[n]
            try:
                CHECKS[name](rank, n)
                q.put((rank, n, name, None))
            except Exception:
                q.put((rank, n, name, traceback.format_exc()))
        dist.destroy_process_group()
    except Exception:
        q.put((rank, world, "setup", traceback.format_exc()))


def _launch(plan):
    """Run checks [(group size, name), ...] in one spawned world of max(size) ranks (process
    startup dominates, so one launch serves every test). Returns {(size, name): [errors]}."""
    world = max(n for n, _ in plan)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, plan, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results = {key: [] for key in plan}
    done = {key: 0 for key in plan}
    try:
        for _ in range(sum(n for n, _ in plan)):
            rank, n, name, err = q.get(timeout=_WAIT)
            if name == "setup":
                for key in plan:
                    results[key].append(f"rank {rank} setup:\n{err}")
                break
            done[(n, name)] += 1
            if err is not None:
                results[(n, name)].append(f"rank {rank}:\n{err}")
    except Exception as exc:  # queue.Empty: something hung
        for key in plan:
            results[key].append(f"no answer within {_WAIT} s ({type(exc).__name__}): a rank hung")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for (n, name), count in done.items():
        if count != n and not results[(n, name)]:
            results[(n, name)].append(f"only {count} of {n} ranks reported")
    return results


def _gs(*args, **kw):
    return gsd.sample(*args, group=_GROUP, **kw)


def _gd(*args, **kw):
    return gsd.sampling_distribution(*args, group=_GROUP, **kw)


def _bounds(V, world, pad=0):
    """Uneven contiguous shards; with pad > 0 every shard has the same width, Megatron style,
    the last columns of the last shards being padding."""
    if pad:
        w = -(-V // world) + pad
        return [r * w for r in range(world)], [w] * world
    base, extra = divmod(V, world)
    sizes = [base + (1 if r < extra else 0) for r in range(world)]
    return [sum(sizes[:r]) for r in range(world)], sizes


def _shard(x, rank, world, pad=0):
    """This rank's slice; padding columns hold garbage (NaN, +inf, huge) that must be ignored."""
    V = x.shape[1]
    starts, sizes = _bounds(V, world, pad)
    s, n = starts[rank], sizes[rank]
    real = x[:, s:min(s + n, V)]
    if real.shape[1] == n:
        return real.contiguous(), s
    junk = torch.tensor([float("nan"), float("inf"), 1e30]).repeat(n)[:n - real.shape[1]]
    return torch.cat([real, junk.expand(x.shape[0], -1).to(x.dtype)], 1), s


def _logits(kind, B, V, gen):
    x = torch.randn(B, V, generator=gen) * 3
    if kind == "ties":
        x = torch.randint(0, 5, (B, V), generator=gen).float()
    elif kind == "neginf":
        x[torch.rand(B, V, generator=gen) < 0.8] = float("-inf")
        x[:, 0] = 0.5
    elif kind == "flat":
        x = torch.zeros(B, V)
    return x


def _elementwise_rows(B, kw, V):
    """Rows kept by an elementwise rule (no active top-k, no top-p): their logprob is summed
    across ranks in float64, so it matches the twin to rounding, not bit for bit."""
    k = kw.get("top_k", 0)
    k = k if isinstance(k, torch.Tensor) else torch.full((B,), k)
    p = kw.get("top_p", 1.0)
    p = p if isinstance(p, torch.Tensor) else torch.full((B,), p)
    return ~((k > 0) & (k < V)) & (p >= 1.0)


def _same_everywhere(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(_GROUP))]
    dist.all_gather(out, t, group=_GROUP)
    assert all(torch.equal(o, t) for o in out), "ranks disagree"


def _compare(x, kw, rank, world, seeds=(0, 1, 2), pad=0, dist_check=True):
    """sample / sampling_distribution against the twin on the concatenated logits."""
    B, V = x.shape
    sh, start = _shard(x, rank, world, pad)
    loose = _elementwise_rows(B, kw, V)
    for s in seeds:
        off = torch.arange(B) * 5 + s
        a_tok, a_lp = gpu_sampler.sample(x, backend="torch", seed=s, offset=off,
                                         return_logprobs=True, **kw)
        b_tok, b_lp = _gs(sh, vocab_start=start, vocab_size=V, seed=s, offset=off,
                                 return_logprobs=True, **kw)
        assert torch.equal(a_tok, b_tok), (kw, s, a_tok, b_tok)
        assert torch.equal(a_lp[~loose], b_lp[~loose]), (kw, s, a_lp, b_lp)
        torch.testing.assert_close(b_lp[loose], a_lp[loose], atol=2e-6, rtol=1e-6)
        _same_everywhere(b_tok)
        _same_everywhere(b_lp)
    if dist_check:
        pa = gpu_sampler.sampling_distribution(x, backend="torch", **kw)
        pb = _gd(sh, vocab_start=start, vocab_size=V, **kw)
        n = min(sh.shape[1], max(V - start, 0))
        mine = pa[:, start:start + n]
        assert (pb[:, n:] == 0).all(), "padding columns got probability"
        assert torch.equal(mine[~loose], pb[~loose, :n]), kw
        torch.testing.assert_close(pb[loose, :n], mine[loose], atol=1e-7, rtol=2e-6)


def _mixes(B, V, gen):
    ids = torch.randint(-1, V, (B, 9), generator=gen)
    rows = lambda *v: torch.tensor(v[:B])  # noqa: E731
    return [
        dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2, input_ids=ids),
        dict(temperature=1.0),
        dict(top_p=0.8),
        dict(top_k=3),
        dict(min_p=0.1, temperature=1.3),
        dict(temperature=0.0, repetition_penalty=1.3, input_ids=ids),
        dict(temperature=rows(0.0, 0.7, 1.0, 0.0, 1.5, 0.8), top_k=rows(0, 50, 10, 5, 0, 2 ** 40),
             top_p=rows(1.0, 0.9, 0.5, 0.9, 0.95, 1.0), min_p=rows(0.0, 0.0, 0.05, 0.0, 0.1, 0.0),
             repetition_penalty=rows(1.0, 1.2, 1.0, 1.3, 1.1, 1.0), presence_penalty=0.3,
             frequency_penalty=0.1, input_ids=ids, prompt_lens=rows(2, 3, 0, 9, 4, 1)),
    ]


# ---------------------------------------------------------------- checks (run in every rank)

def check_mixes(rank, world, pad=0, cases=(("random", 1000), ("ties", 517), ("neginf", 2003),
                                           ("random", 7))):
    gen = torch.Generator().manual_seed(world)
    for i, (kind, V) in enumerate(cases):
        x = _logits(kind, 6, V, gen)
        for kw in _mixes(6, V, gen):
            _compare(x, kw, rank, world, pad=pad if i % 2 == 0 else 0, seeds=(i, 10 + i))
    x = _logits("random", 5, 1000, gen).to(torch.bfloat16)
    sh, start = _shard(x, rank, world)
    a = gpu_sampler.sample(x, backend="torch", seed=3, top_k=20, temperature=0.7)
    assert torch.equal(a, _gs(sh, vocab_start=start, vocab_size=1000, seed=3, top_k=20,
                                     temperature=0.7)), "bf16 shards"


def check_mixes_padded(rank, world):
    check_mixes(rank, world, pad=3)


def check_mixes_light(rank, world):
    # V = 7 padded over 4 ranks: ranks 2 and 3 hold padding only.
    check_mixes(rank, world, pad=2, cases=(("random", 1000), ("neginf", 2003), ("random", 7)))


def check_fallbacks(rank, world):
    """Rows whose first candidates do not hold the kept set: escalation rounds, elementwise
    rounds and the full-row replay of the twin's top-p total."""
    gen = torch.Generator().manual_seed(99)
    before = dict(gsd.stats)
    flat = _logits("flat", 3, 3001, gen)
    for kw in (dict(top_p=0.5), dict(top_k=3), dict(top_k=1000, top_p=0.7), dict(min_p=0.5),
               dict(top_p=0.0)):
        _compare(flat, kw, rank, world, seeds=(1,))
    wide = torch.randn(3, 20000, generator=gen)  # top-p 0.95 alone keeps ~15k tokens
    _compare(wide, dict(top_p=0.95), rank, world, seeds=(2, 3))
    _compare(wide, dict(top_k=torch.tensor([0, 3000, 20000]), top_p=0.9), rank, world,
             seeds=(4,))
    ties = _logits("ties", 4, 3000, gen)
    for kw in (dict(top_p=0.7), dict(top_k=700, top_p=0.5), dict(min_p=0.3, temperature=0.5)):
        _compare(ties, kw, rank, world, seeds=(5,))
    assert gsd.stats["escalations"] > before["escalations"], "no escalation round ran"
    # top_p * Z exactly at a cumulative mass: the estimate cannot decide, the full row does.
    amb = torch.full((2, 50), float("-inf"))
    amb[:, [3, 20, 41]] = torch.tensor([0.0, -math.log(2), -math.log(2)])
    amb[1, 44] = -1.0
    full_rows = gsd.stats["full_rows"]
    _compare(amb, dict(top_p=0.5), rank, world, seeds=(6, 7))
    assert gsd.stats["full_rows"] > full_rows, "no full-row round ran"


def check_nan_and_dead_rows(rank, world):
    gen = torch.Generator().manual_seed(5)
    x = _logits("random", 4, 100, gen)
    starts, sizes = _bounds(100, world)
    x[1, starts[world - 1] + 2] = float("nan")  # NaN only in the last rank's shard
    x[3] = float("-inf")
    sh, start = _shard(x, rank, world)
    for T in (0.0, 0.8):
        with pytest.raises(ValueError, match="logits row 1 contains NaN"):
            _gs(sh, vocab_start=start, vocab_size=100, temperature=T, seed=0)
        with pytest.raises(ValueError, match="logits row 1 contains NaN"):
            _gd(sh, vocab_start=start, vocab_size=100, temperature=T)
        kw = dict(temperature=T, top_k=5, check=False)
        a = gpu_sampler.sample(x, backend="torch", seed=1, return_logprobs=True, **kw)
        b = _gs(sh, vocab_start=start, vocab_size=100, seed=1, return_logprobs=True, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert b[0][1] == -1 and b[0][3] == -1 and b[1][3] == float("-inf")
        d = _gd(sh, vocab_start=start, vocab_size=100, **kw)
        assert (d[[1, 3]] == 0).all()
    ok = x.clone()
    ok[1] = 0.0
    sh, start = _shard(ok, rank, world)
    with pytest.raises(ValueError, match="row 3 has no finite logit"):
        _gs(sh, vocab_start=start, vocab_size=100, seed=0)


def check_bad_arguments(rank, world):
    """Bad input on one rank only: every rank raises, nobody hangs, the group stays usable."""
    gen = torch.Generator().manual_seed(8)
    V = 60
    x = torch.randn(3, V, generator=gen)
    sh, start = _shard(x, rank, world)
    last = rank == world - 1
    cases = [
        (dict(temperature=-1.0 if last else 0.7), "temperature"),
        (dict(top_p=0.5 if rank == 0 else 0.9), "top_p differs"),
        (dict(top_k=torch.tensor([1, 2, 3]) if last else torch.tensor([1, 2, 4])), "top_k differs"),
        (dict(input_ids=torch.tensor([[1], [2], [V if last else 3]])), "input_ids"),
        (dict(seed=1 if rank == 0 else 2), "seed differs"),
        (dict(logits=sh.long() if last else sh), "logits"),
        (dict(logits=torch.cat([sh, sh[:1]]) if rank == 0 else sh), "B differs"),
        (dict(vocab_start=start + (1 if last else 0)), "tile"),
        (dict(vocab_size=V + 5), "cover"),
        (dict(vocab_start=-1 if last else start), "vocab_start"),
    ]
    for kw, msg in cases:
        kw = dict(kw)
        logits = kw.pop("logits", sh)
        vs = kw.pop("vocab_start", start)
        vsz = kw.pop("vocab_size", V)
        kw.setdefault("seed", 0)
        with pytest.raises(ValueError, match=msg):
            _gs(logits, vocab_start=vs, vocab_size=vsz, **kw)
            raise AssertionError(f"no error for the case {msg!r}")
    a = gpu_sampler.sample(x, backend="torch", seed=4, top_k=5)
    assert torch.equal(a, _gs(sh, vocab_start=start, vocab_size=V, seed=4, top_k=5))
    empty = _gs(sh[:0], vocab_start=start, vocab_size=V, seed=4, return_logprobs=True)
    assert empty[0].shape == (0,) and empty[1].shape == (0,)


def check_generator_and_overflow(rank, world):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(8, 300, generator=gen)
    sh, start = _shard(x, rank, world)
    # Each rank's generator differs; rank 0's draw decides, the others advance in step.
    g = torch.Generator().manual_seed(100 + rank)
    tok = _gs(sh, vocab_start=start, vocab_size=300, generator=g, top_k=30)
    _same_everywhere(tok)
    ref = gpu_sampler.sample(x, backend="torch", generator=torch.Generator().manual_seed(100),
                             top_k=30)
    assert torch.equal(tok, ref)
    assert g.initial_seed() == 100 + rank and g.get_state().ne(
        torch.Generator().manual_seed(100 + rank).get_state()).any(), "generator did not advance"
    torch.manual_seed(rank)  # default generators differ per rank: still one answer
    _same_everywhere(_gs(sh, vocab_start=start, vocab_size=300))
    # x / T overflows: the kept set is the argmax tie group of the penalised logits (GUIDE).
    y = torch.randn(3, 300, generator=gen)
    y[0, [5, 150, 299]] = 10.0
    y[1, [7, 200]] = float("inf")
    y[2, 123] = 3e38
    sh, start = _shard(y, rank, world)
    ties = [{5, 150, 299}, {7, 200}, {123}]
    for s in range(6):
        t, lp = _gs(sh, vocab_start=start, vocab_size=300, temperature=1e-40, seed=s,
                           top_p=0.5, return_logprobs=True)
        for r in range(3):
            assert int(t[r]) in ties[r], (r, t)
            assert lp[r] == -torch.log(torch.tensor(float(len(ties[r])))), (r, lp)


def _request_edits(B, V, gen, starts):
    """A random allowed bitmask (about 60% allowed) and a bias whose ids sit on the shards'
    edges, repeat (the values add) and ban (-inf)."""
    mask = gpu_sampler.pack_mask(torch.rand(B, -(-V // 32) * 32, generator=gen) < 0.6)
    edge = [min(max(s + d, 0), V - 1) for s in starts for d in (-1, 0)]
    ids = torch.tensor(edge + [edge[-1], -1])[None].repeat(B, 1)
    values = torch.randn(B, ids.shape[1], generator=gen) * 3
    values[:, 0] = float("-inf")
    return mask, (ids, values)


def check_edits(rank, world, pad=2):
    """allowed_mask and logit_bias over the global vocabulary: the same tokens, logprobs and
    distribution as sample() on the whole row."""
    gen = torch.Generator().manual_seed(21)
    for kind, V in (("random", 1000), ("ties", 517)):
        x = _logits(kind, 6, V, gen)
        starts, _ = _bounds(V, world, pad)
        mask, bias = _request_edits(6, V, gen, starts)
        sh, start = _shard(x, rank, world, pad)
        for kw in _mixes(6, V, gen)[:5] + [dict(temperature=0.0)]:
            kw = dict(kw, allowed_mask=mask, logit_bias=bias)
            a = gpu_sampler.sample(x, backend="torch", seed=3, return_logprobs=True, **kw)
            b = _gs(sh, vocab_start=start, vocab_size=V, seed=3, return_logprobs=True, **kw)
            assert torch.equal(a[0], b[0]), (kw, a[0], b[0])
            torch.testing.assert_close(b[1], a[1], atol=2e-6, rtol=1e-6)
            pa = gpu_sampler.sampling_distribution(x, backend="torch", **kw)
            pb = _gd(sh, vocab_start=start, vocab_size=V, **kw)
            n = min(sh.shape[1], max(V - start, 0))
            torch.testing.assert_close(pb[:, :n], pa[:, start:start + n], atol=1e-7, rtol=2e-6)
    banned = torch.zeros_like(mask)
    with pytest.raises(ValueError, match="allowed_mask row 0 allows no token"):
        _gs(sh, vocab_start=start, vocab_size=V, seed=0, allowed_mask=banned)
    tok = _gs(sh, vocab_start=start, vocab_size=V, seed=0, allowed_mask=banned, check=False)
    assert (tok == -1).all()


def check_top_logprobs(rank, world, pad=2):
    """top_logprobs (raw and processed) over the global vocabulary: sample()'s ids in its
    order (value desc, lowest id on ties), values within a few ulps; N past the kept set or
    past V pads with (-1, -inf)."""
    gen = torch.Generator().manual_seed(31)
    for kind, V, n in (("random", 1000, 5), ("ties", 517, 20), ("random", 7, 9)):
        x = _logits(kind, 6, V, gen)
        sh, start = _shard(x, rank, world, pad)
        for mode, kw in (("raw", dict(temperature=0.7, top_k=50, top_p=0.9)),
                         ("processed", dict(temperature=0.7, top_k=3)),
                         ("processed", dict(top_p=0.8, repetition_penalty=1.3,
                                            input_ids=torch.randint(0, V, (6, 4), generator=gen)))):
            a = gpu_sampler.sample(x, backend="torch", seed=2, top_logprobs=n,
                                   logprobs_mode=mode, **kw)
            b = _gs(sh, vocab_start=start, vocab_size=V, seed=2, top_logprobs=n,
                    logprobs_mode=mode, **kw)
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids), (
                kind, mode, a.top_ids, b.top_ids)
            torch.testing.assert_close(b.top_logprobs, a.top_logprobs, atol=2e-6, rtol=1e-6)
            _same_everywhere(b.top_ids)
            _same_everywhere(b.top_logprobs)
    with pytest.raises(ValueError, match="top_logprobs"):
        _gs(sh, vocab_start=start, vocab_size=V, seed=0, top_logprobs=65)


def check_fuzzed(rank, world):
    """What a fuzzer of the vocab-parallel form found (world 2, halves): each case against
    sample() / sampling_distribution() of the concatenated logits."""
    half = lambda x: (x[:, rank * (x.shape[1] // 2):(rank + 1) * (x.shape[1] // 2)],  # noqa: E731
                      rank * (x.shape[1] // 2))
    # B = 1 raised RuntimeError (a one-row slice of the seeds kept an odd storage offset)
    x = torch.zeros(1, 10)
    x[0, 7] = 5.0
    sh, s = half(x)
    assert _gs(sh, vocab_start=s, vocab_size=10, temperature=0.0).tolist() == [7]
    # top-p on the full-row mass: the ranks replayed exp(logsumexp - M), the twin sums exp(x - M)
    x = torch.randn(2, 20000, generator=torch.Generator().manual_seed(0)) * 1.7
    sh, s = half(x)
    kw = dict(top_p=0.504864513874054)
    ref = gpu_sampler.sampling_distribution(x, backend="torch", **kw)
    assert torch.equal(_gd(sh, vocab_start=s, vocab_size=20000, **kw), ref[:, s:s + 10000])
    a = gpu_sampler.sample(x, backend="torch", seed=0, return_logprobs=True, **kw)
    b = _gs(sh, vocab_start=s, vocab_size=20000, seed=0, return_logprobs=True, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # raw top-N of a row with no finite logit: (-1, -inf), not NaN scores with real ids
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [float("-inf")] * 8])
    sh, s = half(x)
    kw = dict(top_logprobs=3, logprobs_mode="raw", check=False, seed=0)
    a, b = gpu_sampler.sample(x, backend="torch", **kw), _gs(sh, vocab_start=s, vocab_size=8, **kw)
    assert b.top_ids[1].tolist() == a.top_ids[1].tolist() == [-1] * 3
    assert torch.equal(b.top_logprobs[1], a.top_logprobs[1])
    # x / T overflowing to -inf on an all-negative row keeps the argmax, as sample()
    x = torch.tensor([[-1.0, -2.0, -3.0, -0.5], [1.0, 2.0, 3.0, 0.5]])
    sh, s = half(x)
    kw = dict(temperature=1e-40, seed=0, return_logprobs=True)
    a, b = gpu_sampler.sample(x, backend="torch", **kw), _gs(sh, vocab_start=s, vocab_size=4, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # an empty batch with top_logprobs: empty [0, n] results
    for mode in ("raw", "processed"):
        b = _gs(torch.zeros(0, 4), vocab_start=4 * rank, vocab_size=8, seed=0, top_logprobs=3,
                logprobs_mode=mode)
        assert b.top_ids.shape == (0, 3) and b.top_logprobs.dtype == torch.float32
    # top_logprobs and the edits are agreed like every argument: bad or differing values
    # raise on every rank (a bad top_logprobs on one rank left the others waiting)
    sh, s = half(torch.zeros(2, 8))
    bias = (torch.tensor([[6], [6]]), torch.tensor([[100.0], [100.0]]))
    for kw, msg in ((dict(top_logprobs=65 if rank == 1 else 5), "top_logprobs"),
                    (dict(top_logprobs=5 if rank == 0 else None), "top_logprobs"),
                    (dict(top_logprobs=3, logprobs_mode="raw" if rank == 0 else "processed"),
                     "logprobs_mode"),
                    (dict(logit_bias=bias if rank == 0 else None), "logit_bias")):
        with pytest.raises(ValueError, match=msg):
            _gs(sh, vocab_start=s, vocab_size=8, seed=0, **kw)
    # top-N places whose logprobs round equal keep sample()'s order: the (penalised) logit
    for x, kw in ((torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 2),
                   dict(temperature=1e30, top_logprobs=2, logprobs_mode="processed")),
                  (torch.tensor([[0.0, 4e-7, 30.0, -5.0]] * 2),
                   dict(top_logprobs=3, logprobs_mode="raw"))):
        sh, s = half(x)
        a = gpu_sampler.sample(x, backend="torch", seed=0, **kw)
        b = _gs(sh, vocab_start=s, vocab_size=4, seed=0, **kw)
        assert torch.equal(a.top_ids, b.top_ids) and torch.equal(a.top_logprobs, b.top_logprobs)
    # numpy ints for the shard bounds (sample() takes them); errors name local_logits
    import numpy as np
    sh, s = half(torch.zeros(2, 8))
    assert _gs(sh, vocab_start=np.int64(s), vocab_size=np.int32(8), seed=0).shape == (2,)
    with pytest.raises(ValueError, match="local_logits"):
        _gs(sh.double(), vocab_start=s, vocab_size=8)


def check_tp_example(rank, world):
    spec = importlib.util.spec_from_file_location("tp_generate",
                                                  _ROOT / "examples" / "tp_generate.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    from gpu_sampler.tiny import build_model
    model = build_model(1000, seed=0, hidden_size=64, num_layers=2)
    prompt = torch.tensor([[1, 17, 250, 31, 999], [1, 5, 6, 7, 8]])
    got_g = ex.tp_generate(model, prompt, 10, group=_GROUP, temperature=0.0,
                           repetition_penalty=1.1)
    kw = dict(temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.2)
    got_s = ex.tp_generate(model, prompt, 10, group=_GROUP, seed=11, **kw)
    ref_g = gpu_sampler.generate(model, prompt, max_new_tokens=10, do_sample=False,
                                 repetition_penalty=1.1)
    ref_s = gpu_sampler.generate(model, prompt, max_new_tokens=10, do_sample=True, seed=11, **kw)
    assert torch.equal(got_g, ref_g), (got_g, ref_g)
    assert torch.equal(got_s, ref_s), (got_s, ref_s)


CHECKS = {f.__name__[6:]: f for f in (check_mixes, check_mixes_padded, check_mixes_light,
                                       check_fallbacks,
                                       check_nan_and_dead_rows, check_bad_arguments,
                                       check_generator_and_overflow, check_tp_example,
                                       check_edits, check_top_logprobs, check_fuzzed)}


# ---------------------------------------------------------------- tests

_PLAN = [(2, "mixes_padded"), (2, "generator_and_overflow"), (2, "tp_example"), (2, "fuzzed"),
         (3, "mixes"), (3, "fallbacks"), (3, "nan_and_dead_rows"), (3, "bad_arguments"),
         (3, "edits"), (3, "top_logprobs"),
         (4, "mixes_light"), (4, "bad_arguments")]


@pytest.fixture(scope="module")
def results():
    return _launch(_PLAN)


def _assert_ok(results, n, names):
    errors = [f"world {n} {name}: {e}" for name in names for e in results[(n, name)]]
    assert not errors, "\n".join(errors)


def test_two_ranks_padded_vocab_generator_overflow_tp_example(results):
    _assert_ok(results, 2, ["mixes_padded", "generator_and_overflow", "tp_example"])


def test_two_ranks_what_a_fuzzer_found(results):
    _assert_ok(results, 2, ["fuzzed"])


def test_three_uneven_ranks_fallbacks_errors(results):
    _assert_ok(results, 3, ["mixes", "fallbacks", "nan_and_dead_rows", "bad_arguments"])


def test_three_ranks_mask_and_bias_over_the_global_vocabulary(results):
    _assert_ok(results, 3, ["edits"])


def test_three_ranks_top_logprobs_over_the_global_vocabulary(results):
    _assert_ok(results, 3, ["top_logprobs"])


def test_four_ranks_padded_vocab_errors(results):
    _assert_ok(results, 4, ["mixes_light", "bad_arguments"])
