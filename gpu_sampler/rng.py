"""Counter-based randomness shared by the Triton kernel and the torch twin.

A row's uniforms are a pure function of (seed, offset, token id):
    key  = splitmix64(seed ^ splitmix64(offset))                 64-bit row key
    h    = fmix32(fmix32(id * 0x9E3779B1 ^ key_lo) ^ key_hi)     32-bit hash per token
    u    = min((h >> 8 + 0.5) / 2**24, 1 - 2**-24)               in (0, 1)
so the same (seed, offset) gives the same token on CPU and GPU, whatever else is in the batch.
Written here with int64 tensors (wrapping multiply, logical shifts by masking); the kernel
version is in kernels/common.py (_splitmix64, _fmix32, _hash24, _uniform_of).

Float32 facts of u (the twenty-fifth session's statistical fuzzing):
- a = h >> 8 = 2^24 - 1 gives a + 0.5 = 2^24 - 1/2, which rounds to 2^24: u = 1 and Gumbel
  noise +inf, a token that won every draw it was kept in (a floor of 2^-24 per kept token per
  draw, ~V 2^-24 of all draws: 0.76% at V = 128K). The min maps it to the largest float32
  below 1 (G = 16.6); every other value is unchanged.
- For a >= 2^23, a + 0.5 rounds to even, so u has 2^23 levels in [1/2, 1), each the centre of
  its two hash values (unbiased). Two equal logits then share the top noise value about
  V 2^-24 of the time, and the lower id wins that tie (the draw's rule): on an exactly flat
  row of V = 128K the lower half of the ids is drawn ~0.2 percentage points more often than
  the upper half (measured: 0.71% of draws on such a row had a tie at the top).
- The noise's upper tail is cut: G <= -ln(-ln(1 - 2^-24)) = 16.64, and its top levels are
  2^-24 apart in 1 - u, so a token of processed probability below ~3e-7 is under-drawn
  (drawn / exact: 0.98 at 3e-7, 0.87 at 1.1e-7, 0.51 at 4e-8, 0.08 at 1.5e-8; measured 10
  draws against 51.4 expected at 2.5e-8, 500K draws). On whole rows without filtering that
  moves ~7e-5 (V = 32K, logits N(0, 2^2)) to ~1e-3 (V = 128K-152K, N(0, 3^2)) of the mass from
  the far tail to the rest. A fix draws G from all 32 hash bits through the complement
  (G = -ln(-log1p(-w)), w = (h + 1/2) 2^-32: exact up to G = 22.9) on both backends at once
  (the kernels' noise, their fast bound and the screens follow the same chain): a change of
  every seeded stream, not made yet (docs/notes.md, twenty-fifth session).
"""
import numpy as np
import torch

_M32 = 0xFFFFFFFF
U_MAX = 1.0 - 2.0 ** -24  # the largest float32 below 1: u never reaches 1 (G = +inf)


def _s64(c):
    """A uint64 constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= (1 << 63) else c


def _lsr(z, s):
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(z):
    z = z + _s64(0x9E3779B97F4A7C15)
    z = (z ^ _lsr(z, 30)) * _s64(0xBF58476D1CE4E5B9)
    z = (z ^ _lsr(z, 27)) * _s64(0x94D049BB133111EB)
    return z ^ _lsr(z, 31)


def _fmix32(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def row_keys(seed, offset):
    """(key_lo, key_hi) int64 [B, 1] tensors in [0, 2**32) from int64 seed / offset [B]."""
    key = splitmix64(seed ^ splitmix64(offset))
    return (key & _M32).unsqueeze(1), (_lsr(key, 32) & _M32).unsqueeze(1)


def uniform(key_lo, key_hi, ids):
    """float32 uniforms in (0, 1) for token ids (int64, broadcast against [B, 1] keys)."""
    h = ((ids & _M32) * 0x9E3779B1) & _M32
    h = _fmix32(h ^ key_lo)
    h = _fmix32(h ^ key_hi)
    return (((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)).clamp_max(U_MAX)


def gumbel(key_lo, key_hi, ids):
    u = uniform(key_lo, key_hi, ids)
    return -torch.log(-torch.log(u))


def _np_fmix32(h):
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _np_splitmix64(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_M64 = (1 << 64) - 1


def _py_splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _as_rows(v, ids):
    if isinstance(v, torch.Tensor):
        return v.to(torch.int64)
    return torch.full((ids.shape[0],), v, dtype=torch.int64, device=ids.device)


def gumbel_rows(seed, offset, ids):
    """Gumbel noise [B, K] for token ids [B, K] of rows with seed / offset (int or int64 [B]).

    The same bits as kernels/common.py's _uniform. CPU tensors take a numpy path with native
    unsigned arithmetic (an order of magnitude fewer dispatches than int64 torch ops on the
    small candidate sets of the twin); other devices use the torch ops above.
    """
    if ids.device.type != "cpu":
        k_lo, k_hi = row_keys(_as_rows(seed, ids), _as_rows(offset, ids))
        return gumbel(k_lo, k_hi, ids)
    return _gumbel_rows_cpu(seed, offset, ids)


@torch.compiler.disable  # numpy uint32 math: dynamo must not trace it (torch._numpy lacks
# uint32 shifts); reached when sample() runs eagerly inside a compiled region (a graph break)
def _gumbel_rows_cpu(seed, offset, ids):
    B = ids.shape[0]
    if B <= 16:  # a few rows: Python ints beat a dozen numpy calls on 1-element arrays
        seeds = seed.tolist() if isinstance(seed, torch.Tensor) else [seed] * B
        offs = offset.tolist() if isinstance(offset, torch.Tensor) else [offset] * B
        keys = [_py_splitmix64((s & _M64) ^ _py_splitmix64(o & _M64)) for s, o in zip(seeds, offs)]
        k0 = np.array([k & _M32 for k in keys], dtype=np.uint32)[:, None]
        k1 = np.array([k >> 32 for k in keys], dtype=np.uint32)[:, None]
    else:
        with np.errstate(over="ignore"):
            key = _np_splitmix64(_as_rows(seed, ids).numpy().astype(np.uint64)
                                 ^ _np_splitmix64(_as_rows(offset, ids).numpy().astype(np.uint64)))
            k0 = (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)[:, None]
            k1 = (key >> np.uint64(32)).astype(np.uint32)[:, None]
    with np.errstate(over="ignore"):
        h = ids.numpy().astype(np.uint32) * np.uint32(0x9E3779B1)
        h = _np_fmix32(h ^ k0)
        h = _np_fmix32(h ^ k1)
    u = torch.from_numpy(np.minimum(((h >> np.uint32(8)).astype(np.float32) + np.float32(0.5))
                                    * np.float32(1.0 / 16777216.0), np.float32(U_MAX)))
    return -torch.log(-torch.log(u))


def first_best(score, ids, V):
    """The draw's tie rule, once for every torch path: per row, the id of the largest score,
    the lowest id among exact ties (what the kernels do). ``score``, ``ids`` [B, K] (scores of
    the candidates ``ids``, any order), V > every id. Returns (token [B], column [B, 1])."""
    best = score.amax(1, keepdim=True)
    j = torch.where(score == best, ids, V).argmin(1, keepdim=True)
    return ids.gather(1, j).squeeze(1), j


def ordered_topk(keys, k):
    """Ids of the k largest keys per row, ordered key desc then id asc (deterministic where
    torch.topk's order among equal values is not)."""
    V = keys.shape[1]
    vals, idx = torch.topk(keys, min(k + 1, V), dim=-1)
    if k < V:
        # A tie group straddling the k-th place: which members are in is decided by the
        # lowest ids, so those (rare) rows take a stable sort of the whole row.
        straddle = (vals[:, k] == vals[:, k - 1]).nonzero().flatten()
        if straddle.numel():
            idx = idx.clone()
            idx[straddle, :k] = torch.sort(keys[straddle], dim=-1, descending=True,
                                           stable=True).indices[:, :k]
    return order_by_key(keys.gather(1, idx[:, :k]), idx[:, :k])


def order_by_key(keys, ids):
    """(keys, ids) of a small candidate set sorted by key desc, then id asc."""
    ids, pos = ids.sort(dim=-1)
    keys = keys.gather(1, pos)
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    return keys.gather(1, order), ids.gather(1, order)


def top_n(scores, n):
    """The n best (ids, values) of float32 [B, V] scores; columns past V are (-1, -inf)."""
    B, V = scores.shape
    k = min(n, V)
    vals, ids = (ordered_topk(scores, k) if k else
                 (scores[:, :0], torch.empty(B, 0, dtype=torch.int64, device=scores.device)))
    if k < n:
        vals = torch.cat([vals, vals.new_full((B, n - k), float("-inf"))], 1)
        ids = torch.cat([ids, ids.new_full((B, n - k), -1)], 1)
    return ids, vals
