"""Counter-based randomness shared by the Triton kernel and the torch twin.

A row's noise is a pure function of (seed, offset, token id):
    key  = splitmix64(seed ^ splitmix64(offset))                 64-bit row key
    h    = mix32((id * 0x9E3779B1 ^ key_lo) + key_hi)           32-bit hash per token
    w    = min(fl(h + 1/2) 2^-32, 1 - 2^-24)                     upper-tail variate, u = 1 - w
    E    = -ln(1 - w)                                            Exp(1): a series below 1/16
    G    = -ln(E)                                                Gumbel noise of the draw
so the same (seed, offset) gives the same token on CPU and GPU, whatever else is in the batch.
Written here with int64 tensors (wrapping multiply, logical shifts by masking); the kernel
version is in kernels/common.py (_splitmix64, _mix32, _hash32, _tail_of, _exp1_of,
_gumbel_of), the same float32 operations in the same order.

mix32 is a bijective multiply-xorshift mixer (the "lowbias32" constants of Wellons' hash
prospector). Until the thirty-third session h was fmix32(fmix32(id phi ^ key_lo) ^ key_hi),
murmur3's finalizer once per key half; one mix of both halves is 7 instructions a token fewer
in every GPU read that draws (kernels/README.md, "Fewer instructions a token in the reads that
draw") and draws other tokens for the same seed than earlier versions. Checked with pairwise
chi-squares on 2^26 hashes (id distances 1 to 256, low and high bits, keys one bit apart, the
winner of equal logits) and on 2^20 draws (bench/hash_pairs.py): no deviation from
independence that the old hash did not also show at the same seeds (docs/notes.md,
thirty-third session; tests/test_gumbel_noise.py).
key_lo ^ 2^31 and key_hi + 2^31 give the same hashes (xor and add agree on the top bit): 63
effective key bits, which no two rows of a run share but with probability ~2^-63 a pair.

Why w and not u (the twenty-sixth session): a Gumbel draw's upper tail P(G >= g) = e^-g
lives in 1 - u, which float32 cannot resolve near u = 1. The earlier u = (h >> 8 + 1/2) 2^-24
capped G at 16.64 and rounded its top levels to 2^-24 in 1 - u, so a token of processed
probability below ~3e-7 was under-drawn (0.87x at 1.1e-7, 0.51x at 4e-8; ~1e-3 of the mass of
an unfiltered V = 128K row moved out of the far tail). w near 0 keeps all 32 bits (fl(h) is
exact below 2^24) and E is summed from w itself there, so P(G >= g) holds to one hash value
in 2^32 up to g = 22.8 (G <= 22.87): tokens are drawn at their probability down to ~1e-9 of
the kept mass (drawn / exact, computed over every hash value: 0.99998 at 1e-8, 0.998 at
1e-9, 0.81 at 1e-10; a whole N(0, 3^2) row of V = 128K moves 1.3e-7 of its mass, 1e-3
before). The clamp keeps the top 128 hash values (fl(h) = 2^32) finite (G = -2.81).
For a fixed key the hash is a bijection of the id, so no two tokens of a row share h, and the
row's largest noises (w below 2^-8: fl(h) exact) stay distinct in float32: equal logits tie
at the top of a draw about never (0 ties in 1,280 flat rows of V = 128K, where 24 bits gave
0.71%; the lower id would win: the draw's rule, first_best).

``uniform`` is w itself, speculative_sample's acceptance uniform (u q < p): from 24 bits
(u >= 2^-25) a draft with p / q below 2^-25 was never accepted; w takes it at its rate.
"""
import numpy as np
import torch

_M32 = 0xFFFFFFFF
U_MAX = 1.0 - 2.0 ** -24  # the largest float32 below 1: w never reaches 1 (G = -inf)


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


def _mix32(h):
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _M32
    h = h ^ (h >> 15)
    h = (h * 0x846CA68B) & _M32
    return h ^ (h >> 16)


def row_keys(seed, offset):
    """(key_lo, key_hi) int64 [B, 1] tensors in [0, 2**32) from int64 seed / offset [B]."""
    key = splitmix64(seed ^ splitmix64(offset))
    return (key & _M32).unsqueeze(1), (_lsr(key, 32) & _M32).unsqueeze(1)


def _hash(key_lo, key_hi, ids):
    h = ((((ids & _M32) * 0x9E3779B1) & _M32 ^ key_lo) + key_hi) & _M32
    return _mix32(h)


W_SCALE = 2.0 ** -32


def uniform_of_hash(h):
    """w = min(fl(h + 1/2) 2^-32, 1 - 2^-24) in float32 for hash values h (any integer or
    float32 tensor: fl(h) is used): P(w < r) = r to within 2^-33 for r below 2^-8 and 2^-25
    everywhere (the levels are 2^-32 apart near 0, 2^-24 near 1)."""
    return ((h.to(torch.float32) + 0.5) * W_SCALE).clamp_max(U_MAX)


def uniform(key_lo, key_hi, ids):
    """float32 uniforms in (0, 1) for token ids (int64, broadcast against [B, 1] keys): the
    tail variate w of the draw's noise (uniform_of_hash). A test u < r then holds at rate r
    down to r ~ 2^-32 (speculative_sample's acceptance of a draft with p / q ~ 1e-9)."""
    return uniform_of_hash(_hash(key_lo, key_hi, ids))


E_SERIES = 0.0625  # below it E is summed from w: 1 - w would round away w's low bits
# 1/6, 1/5, 1/4, 1/3, 1/2 as float32 (the kernel's literals)
_E_COEF = (0.1666666716337204, 0.20000000298023224, 0.25, 0.3333333432674408, 0.5)


def gumbel_of_hash(h):
    """G = -ln(-ln(1 - w)) from hash values h (any integer or float32 tensor: fl(h) is used),
    float32, as kernels/common.py's _gumbel_of. E = -ln(1 - w) is w (1 + w/2 + ... + w^5/6)
    (Horner, one rounding a step) below 1/16 (truncation <= 2^-26 of E), -ln(1 - w) above
    (1 - w rounds by <= 2^-21 of E)."""
    w = uniform_of_hash(h)
    e = 0.0 - torch.log(1.0 - w)
    if w.device.type != "cpu":
        return 0.0 - torch.log(torch.where(w < E_SERIES, _series(w), e))
    tail = (w < E_SERIES).nonzero(as_tuple=True)  # ~1/16 of the values: only those (no sync here)
    e[tail] = _series(w[tail])
    return 0.0 - torch.log(e)


def _series(w):
    """E = w (1 + w/2 + ... + w^5/6) in float32 for w < 1/16, each Horner step rounded once, as
    the kernels' tl.fma (a GPU contracts it anyway): w s is exact in float64 and no float64
    sum lands on a float32 midpoint for any such w (all 50,331,648 checked against a
    single-rounding fma). MPS has no float64: there each step rounds twice (G one ulp off on
    ~1.7e-4 of the hash values)."""
    wide = torch.float32 if w.device.type == "mps" else torch.float64
    wd = w.to(wide)
    s = (wd * _E_COEF[0] + _E_COEF[1]).float()
    for c in _E_COEF[2:]:
        s = (s.to(wide) * wd + c).float()
    s = (s.to(wide) * wd + 1.0).float()
    return w * s


def gumbel(key_lo, key_hi, ids):
    return gumbel_of_hash(_hash(key_lo, key_hi, ids))


def hash_np(key_lo, key_hi, ids):
    """The tokens' 32-bit hashes h (module docstring), numpy uint32, from uint32 keys (numbers or
    arrays broadcast against ``ids``) and ids: native unsigned arithmetic, for the twin's CPU
    path and for tests that look at the bits themselves."""
    u32 = np.uint32
    with np.errstate(over="ignore"):
        h = np.asarray(ids).astype(u32) * u32(0x9E3779B1) ^ np.asarray(key_lo, dtype=u32)
        h = h + np.asarray(key_hi, dtype=u32)
        h ^= h >> u32(16)
        h *= u32(0x7FEB352D)
        h ^= h >> u32(15)
        h *= u32(0x846CA68B)
        h ^= h >> u32(16)
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

    The same bits as kernels/common.py's _gumbel. CPU tensors take a numpy path with native
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
    h = hash_np(k0, k1, ids.numpy())
    return gumbel_of_hash(torch.from_numpy(h.astype(np.float32)))


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
