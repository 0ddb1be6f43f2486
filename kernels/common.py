"""Device helpers shared by the sampling kernels: parameters, order keys, the counter-based RNG,
the penalised tile loader and the pieces of the pivot search.

Notation for one row (all fp32):
    l       raw logits (any float dtype, upcast on load)
    xp      penalised logits: repetition penalty (HF rule) then presence/frequency (OpenAI rule)
    x       xp / T
    M, Z    max finite x and sum exp(x - M) over finite x
"""
import triton
import triton.language as tl


@triton.jit
def _param(ptr, scalar, row, IS_TENSOR: tl.constexpr, DTYPE: tl.constexpr = tl.float32):
    """A per-row value from a (B,) tensor, or the call's scalar, as DTYPE."""
    v = tl.cast(scalar, DTYPE)
    if IS_TENSOR:
        v = tl.load(ptr + row).to(DTYPE)
    return v


@triton.jit
def _finite(v):
    return (v == v) & (v != float("inf")) & (v != float("-inf"))


@triton.jit
def _bad_row(T, rep, pres, freq):
    """The numeric policy for per-row float parameters: NaN or +-inf anywhere, T < 0, rep <= 0."""
    return (~_finite(T)) | (T < 0.0) | (~_finite(rep)) | (rep <= 0.0) | (~_finite(pres)) \
        | (~_finite(freq))


@triton.jit
def _key(f):
    """Order-preserving map fp32 -> int32 (signed compare on keys = float compare, -0 < +0)."""
    b = f.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _unkey(k):
    b = k ^ ((k >> 31) & 0x7FFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _splitmix64(z):
    z = z + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _mix32(h):
    """A bijective 32-bit mixer (two multiply-xorshift rounds, the "lowbias32" constants of
    Wellons' hash prospector: avalanche bias 0.17 against murmur3's finalizer's 0.26 at the
    same cost). gpu_sampler/rng.py writes the same function for the twin."""
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    return h ^ (h >> 16)


@triton.jit
def _row_key(seed_ptr, seed_s, off_ptr, off_s, row, SEED_T: tl.constexpr, OFF_T: tl.constexpr):
    """The row's 64-bit RNG key as two uint32 halves (see gpu_sampler/rng.py)."""
    seed = _param(seed_ptr, seed_s, row, SEED_T, tl.int64).to(tl.uint64)
    off = _param(off_ptr, off_s, row, OFF_T, tl.int64).to(tl.uint64)
    rkey = _splitmix64(seed ^ _splitmix64(off))
    return (rkey & 0xFFFFFFFF).to(tl.uint32), (rkey >> 32).to(tl.uint32)


@triton.jit
def _hash32(k0, k1, offs):
    """A token's 32 random bits h from a counter-based hash of (row key, token id), as the fp32
    number fl(h) (exact below 2^24, where the noise's upper tail lives). The same function is
    written in torch in gpu_sampler/rng.py, so the kernel and the twin draw the same token for
    the same (seed, offset). The screen (_screened) tests these bits themselves.
    Both key halves enter before one mix, h = mix32((id phi ^ k0) + k1) (two mixes, one per
    half, were 7 more instructions a lane in every read that draws: the gathers and the pure
    rows' stage 1; rng.py's docstring). (id phi + k1) ^ k0, the same cost, spilled 8-16 bytes
    in `gather:min-p screened` at its 64-register cap."""
    h = ((offs.to(tl.uint32) * 0x9E3779B1) ^ k0) + k1
    return _mix32(h).to(tl.float32)


@triton.jit
def _tail_of(a):
    """w = (a + 1/2) 2^-32 from _hash32's bits a: the Gumbel noise's upper-tail variate (u =
    1 - w), resolved to 2^-33 near 0 where u near 1 cannot be; at most 1 - 2^-24 (fl(h) rounds
    to 2^32 for the top 128 hash values, which would give w = 1 and G = -inf)."""
    return tl.minimum((a + 0.5) * 2.3283064365386963e-10, 0.99999994039535522)


@triton.jit
def _exp1_of(w):
    """E = -ln(1 - w) > 0 in fp32 (rng.gumbel_of_hash's E, the same operations): the series
    w (1 + w/2 + ... + w^5/6) by Horner in fmas below w = 1/16 (truncation <= 2^-26 relative),
    where 1 - w would round away w's low bits, else -ln(1 - w) (1 - w rounds by <= 2^-25:
    <= 2^-21 of E)."""
    # explicit fmas: a GPU build contracts s * w + c into one anyway (fp fusion is on but in
    # the CD launches), so the twin rounds each step once too, on every backend
    s = tl.fma(w, 0.1666666716337204, 0.20000000298023224)
    s = tl.fma(s, w, 0.25)
    s = tl.fma(s, w, 0.3333333432674408)
    s = tl.fma(s, w, 0.5)
    s = tl.fma(s, w, 1.0)
    return tl.where(w < 0.0625, w * s, 0.0 - tl.log(1.0 - w))


@triton.jit
def _gumbel(k0, k1, offs):
    """The draw's Gumbel noise of a token (_gumbel_of of its hash bits)."""
    return _gumbel_of(_hash32(k0, k1, offs))


@triton.jit
def _gumbel_of(a):
    """G = -ln(E), E = -ln(1 - w), w = _tail_of(a): every kernel's noise, the beam kernels'
    included, as the twin's torch chain (gpu_sampler/rng.py). Finite, in [-2.81, 22.87]: its
    upper tail P(G >= g) = 1 - e^(-e^-g) holds to one hash value in 2^32 up to g = 22.8, so a
    token is drawn at its probability down to ~1e-9 of the kept mass (u = (h + 1/2) 2^-24 from
    24 bits capped G at 16.64 and under-drew tokens below ~3e-7: 0.51x at 4e-8)."""
    return 0.0 - tl.log(_exp1_of(_tail_of(a)))


# ln(1 + f) / f for f in [-1/3, 1/3): a degree-6 fit (relative error 2^-19.8), Horner from the top
LN_C6 = tl.constexpr(0.17065255343914032)
LN_C5 = tl.constexpr(-0.19407686591148376)
LN_C4 = tl.constexpr(0.19802692532539368)
LN_C3 = tl.constexpr(-0.24841658771038055)
LN_C2 = tl.constexpr(0.3333767056465149)
LN_C1 = tl.constexpr(-0.5000224113464355)
LN_C0 = tl.constexpr(0.9999998807907104)
LN2 = tl.constexpr(0.6931471805599453)
# the bound on |_gumbel_of_fast(a) - _gumbel_of(a)| over every hash value (all 2^24 + 2^26
# distinct fl(h), tests/test_kernel_v3.py: 2^-18.83 measured against the twin's fp32 chain,
# which is itself within 2^-19.9 of float64 where G > 0)
GUMBEL_FAST_ERR = tl.constexpr(2.0 ** -18)


@triton.jit
def _ln_parts(x):
    """(e, f) with x = 2^e (1 + f), f in [-1/3, 1/3) exact, for a normal x > 0."""
    b = x.to(tl.int32, bitcast=True)
    e = (b - 0x3F2AAAAB) >> 23
    f = (b - (e << 23)).to(tl.float32, bitcast=True) - 1.0
    return e, f


@triton.jit
def _ln_poly(e, f):
    """e ln 2 + ln(1 + f) for f in [-1/3, 1/3), to ~2^-20 relative."""
    q = LN_C6 * f + LN_C5
    q = q * f + LN_C4
    q = q * f + LN_C3
    q = q * f + LN_C2
    q = q * f + LN_C1
    q = q * f + LN_C0
    return e.to(tl.float32) * LN2 + f * q


@triton.jit
def _ln_fast(x):
    """ln(x) for x >= 0 (normal or zero; 0 -> -inf), to ~2^-20 relative: x = 2^e m with m in
    [2/3, 4/3), ln x = e ln 2 + f P(f), f = m - 1 (exact). Half the instructions of tl.log
    (libdevice's degree-10 polynomial plus its denormal and special-value paths)."""
    e, f = _ln_parts(x)
    return tl.where(x > 0.0, _ln_poly(e, f), float("-inf"))


@triton.jit
def _gumbel_of_fast(a):
    """_gumbel_of(a) within GUMBEL_FAST_ERR. E = -ln(1 - w) takes f = -w itself where 1 - w is
    in [2/3, 1] (e = 0: no rounding of 1 - w, so the tail keeps every bit of w), -ln(1 - w)
    elsewhere; then G = -ln E, both logs _ln_fast's polynomial. Only for stage 1's approximate
    draw scores, whose error the merge's slack covers (merge.py)."""
    w = _tail_of(a)
    e, f = _ln_parts(1.0 - w)
    f = tl.where(e == 0, 0.0 - w, f)
    return 0.0 - _ln_fast(0.0 - _ln_poly(e, f))


@triton.jit
def _gumbel_fast(k0, k1, offs):
    return _gumbel_of_fast(_hash32(k0, k1, offs))


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _add(a, b):
    """A sum as a reduction's combine (tl.sum's tree: under the interpreter too, where tl.sum
    is numpy's and a combine is kernels/interpreter.py's tree, the tree a fused sum takes)."""
    return a + b


@triton.jit
def _add_max(a1, b1, a2, b2):
    """(sum, max) of two operands in one reduction."""
    return a1 + a2, tl.maximum(b1, b2)


@triton.jit
def _add2_max(a0, a1, a2, b0, b1, b2):
    """(sum, sum, max): the slot words' totals and a max in one reduction."""
    return a0 + b0, a1 + b1, tl.maximum(a2, b2)


@triton.jit
def _kept_slots(keep, TILE: tl.constexpr, R: tl.constexpr):
    """Exclusive rank of each kept lane in id order (its slot among the block's candidates in
    stage 1, among the block's band tokens in the band gather).

    The tile is viewed as [TILE / R, R] with R = the program's threads: with one element per
    thread, row r of thread j is lane r * R + j, so each thread packs its rows' keep bits into
    two int32 words (_slot_words) and a single scan of the word pair over the R threads ranks
    every row at once (a per-lane cumsum scans each row separately); _word_slots reads the
    slots off. Everything after the scan is 32-bit: a slot is one byte-field extract and one
    add (an int64 form spent ~8 instructions a lane on 64-bit shifts and address carries).
    Geometries whose rows do not fit two words (or one row a thread) take the plain cumsum."""
    NREP: tl.constexpr = TILE // R
    FW: tl.constexpr = 8 if R < 256 else 16
    # packed: >= 2 rows a thread, half of them in one int32 word
    if NREP > 1 and (NREP // 2) * FW <= 32:
        w0, w1 = _slot_words(keep, TILE, R)
        t0, t1 = tl.reduce((w0, w1), 0, _add2)
        slot = _word_slots(w0, w1, t0, t1, TILE, R)
    else:
        kept = keep.to(tl.int32)
        slot = tl.cumsum(kept, 0) - kept
    return slot


@triton.jit
def _kept_slots_max(keep, v, TILE: tl.constexpr, R: tl.constexpr):
    """(_kept_slots(keep), max of v): v's max reduced with the slot words' totals, one
    cross-warp exchange for both (v's lanes first within each thread: the same rows)."""
    NREP: tl.constexpr = TILE // R
    FW: tl.constexpr = 8 if R < 256 else 16
    if NREP > 1 and (NREP // 2) * FW <= 32:  # _kept_slots' packed geometries
        w0, w1 = _slot_words(keep, TILE, R)
        vr = tl.max(tl.reshape(v, [NREP, R]), axis=0)
        t0, t1, vmax = tl.reduce((w0, w1, vr), 0, _add2_max)
        slot = _word_slots(w0, w1, t0, t1, TILE, R)
    else:
        kept = keep.to(tl.int32)
        slot = tl.cumsum(kept, 0) - kept
        vmax = tl.max(v, axis=0)
    return slot, vmax


@triton.jit
def _slot_words(keep, TILE: tl.constexpr, R: tl.constexpr):
    """Each thread's keep bits as two int32 words ([R] each): rows [0, HALF) in the first,
    [HALF, 2 HALF) in the second, FW bits a row (a row holds <= R lanes: no field carries)."""
    NREP: tl.constexpr = TILE // R
    FW: tl.constexpr = 8 if R < 256 else 16
    HALF: tl.constexpr = NREP // 2
    r = tl.arange(0, NREP)[:, None]
    bits = tl.reshape(keep.to(tl.int32), [NREP, R]) << ((r % HALF) * FW)
    low = r < HALF
    return tl.sum(tl.where(low, bits, 0), axis=0), tl.sum(tl.where(low, 0, bits), axis=0)


@triton.jit
def _word_slots(w0, w1, t0, t1, TILE: tl.constexpr, R: tl.constexpr):
    """The lanes' slots from the words and their totals over the threads (t0, t1): one scan
    of the pair, then each row's count before it plus the lane's rank within its row."""
    NREP: tl.constexpr = TILE // R
    FW: tl.constexpr = 8 if R < 256 else 16
    HALF: tl.constexpr = NREP // 2
    fmask: tl.constexpr = (1 << FW) - 1
    r = tl.arange(0, NREP)[:, None]
    sh = (r % HALF) * FW
    low = r < HALF
    c0, c1 = tl.associative_scan((w0, w1), 0, _add2)
    rowtot = (tl.where(low, t0, t1) >> sh) & fmask
    excl = tl.where(low, (c0 - w0)[None, :], (c1 - w1)[None, :])
    return tl.reshape((tl.cumsum(rowtot, 0) - rowtot) + ((excl >> sh) & fmask), [TILE])


# The draw's screen (kernels/band.py's gather and finish, kernels/second.py's gather): the
# winner's score, max over the kept set of (x - M) + G, is Gumbel with location ln W_kept, so it
# is below S = ln W - SCREEN_C for any W <= W_kept with probability <= exp(-e^SCREEN_C) =
# 1.9e-9. A kernel scores exactly (two logs a token) only the tokens that can reach S and the
# finish checks the winner against S, re-drawing the row unscreened below it: every answer is
# the unscreened one whatever the noise; W only sets how often that happens. Floor -60: a token
# whose e^(x - M) flushes to 0 (x - M < -87.3) scores < -64 (the noise is < 22.9).
SCREEN_C = tl.constexpr(3.0)
SCREEN_FLOOR = tl.constexpr(-60.0)
# the screen's slack in score units (_screen_scale): covers the fp32 rounding of e^(x - M) (its
# argument's rounding included, |x - M| < 90), of the product e ks, of w and E and of the
# score's two logs and sum, each a few ulp, by orders of magnitude
SCREEN_M = tl.constexpr(2.0 ** -7)


@triton.jit
def _screen_bound(w):
    """S for a kept mass of at least ~w (e^(x - M) units; above)."""
    return tl.maximum(tl.log(w) - SCREEN_C, SCREEN_FLOOR)


@triton.jit
def _screen_scale(s):
    """The screen factor ks = e^(SCREEN_M - S), SCREEN_M the slack for the screen's fp32
    rounding; +inf for S = -inf (no screen)."""
    return tl.exp(-s + SCREEN_M)


@triton.jit
def _screened(kept, a, e, ks, SCREEN: tl.constexpr):
    """The kept lanes the draw scores: with SCREEN only those that can score >= S. A lane
    scores >= S only if E = -ln(1 - w) <= e^(x - M - S), and E >= w, so a lane with w > e ks
    scores < S: its noise's two logs are skipped, and the whole block's when every lane is (a
    uniform branch). With ks = +inf every kept lane with e > 0 is scored.
    Tested on the hash bits a (_hash32, w = (a + 1/2) 2^-32): a <= fl(e fl(ks 2^32)) keeps every
    lane with w <= e ks (the dropped 1/2 and the product's rounding, <= 2^-23 relative, are far
    inside SCREEN_M): a superset, in one multiply and a compare (w itself, and the logs, only a
    scoring block computes)."""
    if SCREEN:
        return kept & (a <= e * (ks * 4294967296.0))
    return kept


# the draw's tie rule: the largest score, the lowest token id among equal scores
NO_ID = tl.constexpr(2147483647)


@triton.jit
def _best(s, ids, p):
    """(best score, its lowest id (NO_ID if none is finite), that token's p): the
    per-lane maxima of _better reduced once."""
    b = tl.max(s, axis=0)
    bid = tl.min(tl.where((s == b) & (s > float("-inf")), ids, NO_ID), axis=0)
    bp = tl.sum(tl.where(ids == bid, p, 0.0), axis=0)
    return b, bid, bp


@triton.jit
def _better(b, bid, bp, cb, cid, cp):
    """Merge two (score, id, p) maxima (scalars or per lane): the larger score, the lower id
    on a tie."""
    upd = (b > cb) | ((b == cb) & (bid < cid))
    return tl.where(upd, b, cb), tl.where(upd, bid, cid), tl.where(upd, bp, cp)


@triton.jit
def _pure_row(T, k, p, lminp, V, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
              HAS_MINP: tl.constexpr):
    """A sampling row with no threshold to find (pure temperature): T > 0 and no top-k
    (k <= 0 or k >= V), no top-p (p >= 1), no min-p (min_p <= 0). Its kept set is every finite
    x, so its draw is block-decomposable. Stage 1 and the merge both decide it from the
    parameters alone (invalid rows are caught by the merge as before)."""
    pure = T > 0.0
    if HAS_TOPK:
        pure = pure & ((k <= 0) | (k >= V))
    if HAS_TOPP:
        pure = pure & (p >= 1.0)
    if HAS_MINP:
        pure = pure & (lminp == float("-inf"))
    return pure


# a candidate slot: x (fp32 bits, low word) and its token id (high word) in one int64, so
# stage 1 stores (and the merge loads) one word per candidate; an empty slot is x = -inf
EMPTY_SLOT = tl.constexpr(0xFF800000)


@triton.jit
def _pack_cand(x, ids):
    v = (ids.to(tl.uint32).to(tl.uint64) << 32) | x.to(tl.uint32, bitcast=True).to(tl.uint64)
    return v.to(tl.int64, bitcast=True)


@triton.jit
def _cand_x(v):
    return v.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _cand_id(v):
    return (v >> 32).to(tl.int32)


@triton.jit
def _head(e, me, la):
    """The contrastive plausibility head given the expert max me: p_e >= cd_alpha * max p_e,
    written as e > -inf and (e == me or e - me >= log cd_alpha), the twin's exact fp32 rule.
    fl(e - me) is monotone in me, so a smaller me (a block's own max) keeps a superset."""
    return (e > float("-inf")) & ((e == me) | ((e - me) >= la))


@triton.jit
def _cd_scores(e, a, la, beta, me):
    """(1 + beta) e - beta a on the head (e when beta == 0), -inf elsewhere, NaN where e or a
    is NaN: gpu_sampler/contrastive.py's contrastive_scores_reference, element for element."""
    s = tl.where(beta == 0.0, e, (1.0 + beta) * e - beta * a)
    s = tl.where(_head(e, me, la), s, float("-inf"))
    return tl.where((e != e) | (a != a), float("nan"), s)


@triton.jit
def _penalised_tile(lrow_ptr, erow_ptr, brow_ptr, xrow_ptr, NT, t, V, rep, pres, freq,
                    TILE: tl.constexpr, E_BLOCK: tl.constexpr,
                    HAS_REP: tl.constexpr, HAS_PF: tl.constexpr,
                    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                    arow_ptr, la, beta, me, CD: tl.constexpr, LOCAL: tl.constexpr):
    """Statistics block t of the row: (token ids, in-bounds mask, penalised xp, expert block
    max, min expert logit on the block's head, the logits as loaded in fp32: top-N "raw").

    With CD the row is the contrastive score of the expert logits (lrow) and the amateur's
    (arow, one extra read), cut to the head of ``me`` (the row's expert max), or with LOCAL of
    the block's own expert max (a superset of the row's head: the merge corrects it). A
    request's mask and bias come next (_masked_biased), then the penalties from the block's
    history (_history_penalised).
    """
    # int64 only in the block's base pointer: per-lane offsets stay int32 (V < 2^31)
    start = tl.cast(t, tl.int64) * TILE
    lane = tl.arange(0, TILE)
    offs = start.to(tl.int32) + lane
    inb = lane < (V - start).to(tl.int32)
    xp = tl.load(lrow_ptr + start + lane, mask=inb, other=float("-inf")).to(tl.float32)
    raw = xp
    emax = tl.zeros([], tl.float32)
    elo = tl.zeros([], tl.float32)
    if CD:
        a = tl.load(arow_ptr + start + lane, mask=inb, other=0.0).to(tl.float32)
        if LOCAL:
            me = tl.max(tl.where(xp != xp, float("-inf"), xp), axis=0)
        emax = me
        elo = tl.min(tl.where(_head(xp, me, la), xp, float("inf")), axis=0)
        xp = _cd_scores(xp, a, la, beta, me)
    if HAS_MASK or HAS_BIAS:
        xp = _masked_biased(xp, xrow_ptr, t, V, start, lane, offs, inb, HAS_MASK, HAS_BIAS)
    if HAS_REP or HAS_PF:
        xp = _history_penalised(xp, erow_ptr, brow_ptr, NT, t, start, lane, rep, pres, freq,
                                TILE, E_BLOCK, HAS_REP, HAS_PF)
    return offs, inb, xp, emax, elo, raw


@triton.jit
def _masked_biased(xp, xrow_ptr, t, V, start, lane, offs, inb, HAS_MASK: tl.constexpr,
                   HAS_BIAS: tl.constexpr):
    """A request's mask and bias (gpu_sampler/edits.py), from the row's edit table ``xrow``
    (kernels/launch.py ``edit_table``): a disallowed lane becomes -inf (the block reads its
    TILE / 8 bytes of mask words, at addresses known without a load), and the block's own bias
    entries, sorted by id, are added one after the other (duplicates add up in their given
    order, as torch's accumulating index_put_ does)."""
    if HAS_MASK:
        word = tl.load(xrow_ptr + (offs >> 5), mask=inb, other=0)
        xp = tl.where(((word >> (offs & 31)) & 1) != 0, xp, float("-inf"))
    if HAS_BIAS:
        head = xrow_ptr
        if HAS_MASK:
            head += (V + 31) >> 5  # past the mask words
        nb = tl.load(head)
        for h in range(tl.load(head + 1 + t), tl.load(head + 2 + t)):
            hit = lane == tl.load(xrow_ptr + h) - start.to(tl.int32)
            xp = tl.where(hit, xp + tl.load(xrow_ptr + h + nb).to(tl.float32, bitcast=True), xp)
    return xp


@triton.jit
def _rep_penalised(xp, seen, rep):
    """transformers' repetition penalty on the tokens seen: x * rep below 0, x / rep above (the
    correctly rounded quotient, torch's: _quotient)."""
    return tl.where(seen > 0, tl.where(xp < 0, xp * rep, _quotient(xp, rep)), xp)


@triton.jit
def _history_penalised(xp, erow_ptr, brow_ptr, NT, t, start, lane, rep, pres, freq,
                       TILE: tl.constexpr, E_BLOCK: tl.constexpr, HAS_REP: tl.constexpr,
                       HAS_PF: tl.constexpr):
    """The penalties of block t from its history edits: the slice [start_t, end_t) of the
    row's bucketed edit list (kernels/history.py: one int32 per history position,
    ``id * 2 + counts_for_presence``), turned into per-slot counts (compared with the lanes
    when there are one or two, tl.histogram otherwise)."""
    if HAS_REP and (not brow_ptr.dtype.is_ptr()):
        # the unbucketed history (sampling._direct_history: a launch whose stage 1 runs one
        # block a program, repetition penalty only, L <= E_BLOCK <= 256, no history launch):
        # erow_ptr is the row's own contiguous ids and brow_ptr their number L. The block
        # histograms the ids that fall in it, the same set as its bucketed slice
        # (0 <= id - start < TILE), so the same seen > 0 and the same xp (stage 1, and the
        # merge's rare re-reads: that merge compiles at the 192-register cap, 16 bytes spilled
        # at 128; one id at a time there was a latency-bound loop, 125 us modelled on a
        # confident row's dirty block)
        tl.static_assert(not HAS_PF)
        hoffs = tl.arange(0, E_BLOCK)
        ids = tl.load(erow_ptr + hoffs, mask=hoffs < brow_ptr, other=-1)
        hin = (ids >= start) & (ids < start + TILE)
        seen = tl.histogram(tl.where(hin, ids - start, 0).to(tl.int32), TILE, mask=hin)
        xp = _rep_penalised(xp, seen, rep)
    else:
        e0 = tl.load(brow_ptr + t)
        e1 = tl.load(brow_ptr + NT + t)
        seen = tl.zeros([TILE], dtype=tl.int32)
        cnt = tl.zeros([TILE], dtype=tl.int32)
        if e1 - e0 <= 2:
            # a block with one or two edits (most blocks at short histories): compare them
            # with the lanes rather than build a TILE-bin histogram in shared memory
            for h in range(e0, e1):
                code = tl.load(erow_ptr + h)
                hit = lane == (code >> 1) - start.to(tl.int32)
                if HAS_REP:
                    seen += hit.to(tl.int32)
                if HAS_PF:
                    cnt += (hit & ((code & 1) == 1)).to(tl.int32)
        else:
            for h0 in range(e0, e1, E_BLOCK):
                hoffs = h0 + tl.arange(0, E_BLOCK)
                hin = hoffs < e1
                code = tl.load(erow_ptr + hoffs, mask=hin, other=0)
                rel = (code >> 1) - start.to(tl.int32)
                if HAS_REP:
                    seen += tl.histogram(rel, TILE, mask=hin)
                if HAS_PF:
                    cnt += tl.histogram(rel, TILE, mask=hin & ((code & 1) == 1))
        if HAS_REP:
            xp = _rep_penalised(xp, seen, rep)
        if HAS_PF:
            xp = xp - (tl.where(cnt > 0, pres, 0.0) + freq * cnt.to(tl.float32))
    return xp


# per-row state the merge leaves for the distribution writer and processed top-N logprobs
# (kernels/merge.py writes it, _write_probs_kernel and kernels/topn.py read it; float32 [B, 5],
# int32 [B, 2]: flags valid | sampling << 1 | overflowed << 2, greedy token)
S_M, S_TAU, S_ZF, S_XPMAX, S_ME = (tl.constexpr(i) for i in range(5))
NS = tl.constexpr(5)


# the band read's bins (kernels/stats.py writes, kernels/band.py reads): BAND_S bins per unit of
# x, NBIN bins per block (16 units below the block's max; the last bin is open)
BAND_S = tl.constexpr(8.0)
NBIN = tl.constexpr(128)
SHIFT_MAX = tl.constexpr(8192.0)


@triton.jit
def _band_bin(xp, F, s):
    """A finite token's bin in its block: j = min(F - floor(xp s), NBIN - 1) with s = BAND_S / T
    and F = floor(vm s) (vm the block's max finite xp), as F - floor(max(xp s, F - 127)) in
    integers (floor is monotone; F - 127 is an integer): one float-to-int conversion, no
    float subtract and select. Non-finite xp get some bin (every caller masks them out). An
    estimate's grid: every kernel that bins a token uses this same arithmetic on the same xp
    and the F that stage 1 stored, so a token lands in the same bin in all of them. Exact while
    |F| < 2^24: past it F - 127 rounds (to F - 128 at 2^25), a bin 128 that stage 1's histogram
    drops, so the plan refuses rows whose top bin reaches F_BAND_MAX (band_plan.py)."""
    y = tl.maximum(xp * s, F - (NBIN - 1))
    return F.to(tl.int32) - tl.floor(y).to(tl.int32)


@triton.jit
def _band_shift(fmax, F):
    """Block bin j -> row bin J = j + shift: shift = Fmax - F (exact: both are integers in
    fp32), clamped at SHIFT_MAX (NaN / inf -> SHIFT_MAX: blocks with no finite token)."""
    d = fmax - F
    return tl.where(d < SHIFT_MAX, d, SHIFT_MAX).to(tl.int32)


@triton.jit
def _row_scale(temp_ptr, temp_s, rep_ptr, rep_s, pres_ptr, pres_s, freq_ptr, freq_s, row,
               TEMP_T: tl.constexpr, REP_T: tl.constexpr, PRES_T: tl.constexpr,
               FREQ_T: tl.constexpr):
    """(T, rep, pres, freq, tdiv): a row's temperature and penalties, and the divisor of its
    penalised logits, x = xp / tdiv (T; 1 for a greedy or invalid row, whose x is xp)."""
    T = _param(temp_ptr, temp_s, row, TEMP_T)
    rep = _param(rep_ptr, rep_s, row, REP_T)
    pres = _param(pres_ptr, pres_s, row, PRES_T)
    freq = _param(freq_ptr, freq_s, row, FREQ_T)
    return T, rep, pres, freq, tl.where((T == 0.0) | _bad_row(T, rep, pres, freq), 1.0, T)


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _mass_of(x, M):
    """e = e^(x - M), a token's mass, in the reads over a whole row (the band gather, the second
    read's gather): ex2 of the product with log2 e, which is how tl.exp computes it on the GPU,
    without tl.exp's rescaling for a subnormal result (3 of its 6 instructions a lane), so a
    mass below 2^-126 (x - M < -87.3) is 0: the max token's own mass is 1, and every threshold,
    sum and screen of these reads has a slack far above it."""
    return tl.math.exp2((x - M) * LOG2E)


@triton.jit
def _reciprocal_normal(d):
    """y = fl(1 / d) of a row-uniform d in [2^-125, 2^125] (_reciprocal for any d), correctly
    rounded; no division (div.full.f32 is within 2 ulps, div.rn.f32's slow path is a call, and
    five variants spilled around it), the same operations on the GPU and the interpreter: a
    seed from d's bits (0x7EF311C3 - d, within 12.5%), then four Newton steps y + y (1 - d y),
    the residual exact in one fma. They give the correctly rounded reciprocal for every
    significand but the all-ones one (Markstein's exception: 1 / d lies 2^-49 above a rounding
    midpoint), whose reciprocal is set from d's exponent (`python bench/quotient_exhaustive.py
    --reciprocal`: every significand at eight exponents)."""
    b = d.to(tl.int32, bitcast=True)
    y = (0x7EF311C3 - b).to(tl.float32, bitcast=True)
    for _ in tl.static_range(4):
        y = tl.fma(tl.fma(-d, y, 1.0), y, y)
    ones = (b & 0x7FFFFF) == 0x7FFFFF
    yo = ((b & -2147483648) | ((253 - ((b >> 23) & 255)) << 23) | 1).to(tl.float32,
                                                                      bitcast=True)
    return tl.where(ones, yo, y)


@triton.jit
def _divisor_scale(d):
    """2^24 for a divisor below 2^-125 (a subnormal T included: 1 / T is not normal or
    overflows), 2^-24 above 2^125, else 1: d s is then in [2^-125, 2^125], exactly."""
    a = tl.abs(d)
    return tl.where(a < 2.0 ** -125, 16777216.0, tl.where(a > 2.0 ** 125, 1.0 / 16777216.0, 1.0))


@triton.jit
def _reciprocal(d):
    """y = fl(1 / d) of a finite, nonzero, row-uniform d: _reciprocal_normal of d scaled into
    its range (_divisor_scale), scaled back, both exact but where 1 / d overflows (+-inf, as
    the division) or, for d > 2^125, is subnormal."""
    d = tl.cast(d, tl.float32)
    s = _divisor_scale(d)
    return _reciprocal_normal(d * s) * s


@triton.jit
def _markstein(xp, d, y):
    """fl(xp / d) from y = fl(1 / d) (_quotient): q = fl(xp y), then q + (xp - q d) y, the
    remainder exact in one fma; +-inf and NaN make the remainder NaN and keep q."""
    q = xp * y
    c = tl.fma(tl.fma(-q, d, xp), y, q)
    return tl.where(c == c, c, q)


@triton.jit
def _band_scale(tdiv):
    """s = BAND_S / T, the band bins' scale (stage 1 and the band gather bin with it): BAND_S
    fl(1 / T), the rounded reciprocal times a power of two, so fl(BAND_S / T) exactly."""
    return BAND_S * _reciprocal(tdiv)


@triton.jit
def _log2e_scale(tdiv):
    """log2(e) / T as log2(e) fl(1 / T): the scale of stage 1's block sums z_t (and of the
    merge's redone blocks), an estimate's factor, not the twin's quotient."""
    return LOG2E * _reciprocal(tdiv)


@triton.jit
def _quotient(xp, tdiv):
    """x = fl(xp / tdiv) for a row-uniform tdiv (T, or the repetition penalty), correctly
    rounded as the twin's (torch's) quotient, lane by lane or of one value: every kernel's
    x = xp / T. Not Triton's fp32 `/`, which compiles to PTX div.full.f32, an approximation
    within 2 ulps: on a GPU x was not the twin's at the last bit (another tie group, tau or
    score), while the interpreter divides exactly (kernels/aot.py approx_divisions finds it
    in the PTX). Nor div.rn.f32 on every lane: its slow path is a call, and five variants
    spilled around it. Markstein's correction instead: with y = fl(1 / tdiv) (_reciprocal)
    and q = fl(xp y) within an ulp of xp / tdiv, the remainder xp - q tdiv is exact in one
    fma and fl(q + (xp - q tdiv) y) is the correctly rounded quotient wherever the remainder
    does not underflow: every xp with |xp| >= 2^-102 (`python bench/quotient_exhaustive.py`:
    all 2^32 dividends; below, logits that are 0 in all but name, it can miss by an ulp;
    tests/test_quotient.py checks it against torch). +-inf and NaN keep q; xp = -0 gives +0
    (equal to -0 in every comparison, sum and exp). Six instructions a lane where
    div.full.f32 took three (the scale's multiply, below, included). At tdiv = 1 (T 1.0, the
    usual top-p temperature) a uniform branch skips it all (xp / 1 = xp): the band gather,
    modelled (64, 128256) T 1.0 top-p 0.95, 54.0 -> 50.2 us."""
    if tdiv == 1.0:
        x = xp
    else:
        # a divisor outside [2^-125, 2^125] (a subnormal T: its reciprocal overflows) divides
        # the pair scaled by 2^+-24, xp s / (tdiv s): xp s is exact wherever the quotient is
        # neither +-inf nor below 2^-227 (0 either way). One multiply a lane (s = 1 else): a
        # uniform branch around it spilled in two more variants (merge:distribution 12 bytes,
        # band_finish:second 20)
        s = _divisor_scale(tl.cast(tdiv, tl.float32))
        d = tdiv * s
        x = _markstein(xp * s, d, _reciprocal_normal(d))
    return x


@triton.jit
def _tempered(xp, tdiv, ovf_row, xpmax):
    """x = xp / T (_quotient); an overflowed row keeps its xp argmax tie group (x = 0, rest
    -inf)."""
    x = _quotient(xp, tdiv)
    return tl.where(ovf_row, tl.where(xp == xpmax, 0.0, float("-inf")), x)


# ---- the pivot search, shared by the candidate search (merge) and the row search (fallback) --

@triton.jit
def _pivots(lo, pv, NPIV: tl.constexpr):
    """NPIV pivots in (lo, pv]: half evenly in value, half evenly in the fp32 key space."""
    H: tl.constexpr = NPIV // 2
    j = tl.arange(0, NPIV)
    jj = (j % H + 1).to(tl.int64)
    klo = _key(lo).to(tl.int64)
    kpv = _key(pv).to(tl.int64)
    kp = klo + ((kpv - klo) * jj + H - 1) // H
    key_piv = _unkey(kp.to(tl.int32))
    f = jj.to(tl.float32) * (1.0 / (H + 1))
    val_piv = lo * (1.0 - f) + pv * f
    val_piv = tl.minimum(tl.maximum(val_piv, _unkey((klo + 1).to(tl.int32))), pv)
    return tl.where(j < H, val_piv, key_piv)


@triton.jit
def _maxmin_combine(m1, l1, m2, l2):
    """(max, min) of two operands in one reduction: one cross-warp exchange for both."""
    return tl.maximum(m1, m2), tl.minimum(l1, l2)


@triton.jit
def _edges_combine(lo1, hi1, n1, w1, lo2, hi2, n2, w2):
    """(min, max, sum, float sum) in one reduction: one cross-warp exchange for the four. The
    float sum takes tl.sum's order on the GPU (the same tree for any combine); the
    interpreter folds it pairwise (kernels/interpreter.py), its own fixed order."""
    return tl.minimum(lo1, lo2), tl.maximum(hi1, hi2), n1 + n2, w1 + w2


@triton.jit
def _edges_mass_combine(lo1, hi1, w1, lo2, hi2, w2):
    """_edges_combine without the count."""
    return tl.minimum(lo1, lo2), tl.maximum(hi1, hi2), w1 + w2


@triton.jit
def _pivot_partials(x, e, piv, cnt, mass, nxt, prv, USE_COUNT: tl.constexpr,
                    ONE_REDUCE: tl.constexpr = True):
    """Accumulate, per pivot t: #{x >= t}, sum_{x >= t} e, min{x >= t}, max{x < t}. With
    ONE_REDUCE all in one reduction (one cross-warp exchange: the list searches' rounds are
    a chain of them); else the sums apart from (min, max), fewer registers live at once (the
    row pass, inlined where the band finish's cap leaves no room)."""
    ge = x[:, None] >= piv[None, :]
    if ONE_REDUCE:
        lo = tl.where(ge, x[:, None], float("inf"))
        hi = tl.where(ge, float("-inf"), x[:, None])
        w = tl.where(ge, e[:, None], 0.0)
        if USE_COUNT:
            above, below, n, s = tl.reduce((lo, hi, ge.to(tl.float32), w), 0, _edges_combine)
            cnt += n
        else:
            above, below, s = tl.reduce((lo, hi, w), 0, _edges_mass_combine)
    else:
        if USE_COUNT:
            cnt += tl.sum(ge.to(tl.float32), axis=0)
        s = tl.sum(tl.where(ge, e[:, None], 0.0), axis=0)
        below, above = tl.reduce((tl.where(ge, float("-inf"), x[:, None]),
                                  tl.where(ge, x[:, None], float("inf"))), 0, _maxmin_combine)
    return cnt, mass + s, tl.minimum(nxt, above), tl.maximum(prv, below)


@triton.jit
def _add_max_min_min(n1, a1, b1, c1, n2, a2, b2, c2):
    """(sum, max, min, min) of four operands in one reduction."""
    return n1 + n2, tl.maximum(a1, a2), tl.minimum(b1, b2), tl.minimum(c1, c2)


@triton.jit
def _pivot_update(cnt, mass, nxt, prv, lo, pv, lo_mass, target, NPIV: tl.constexpr,
                  USE_COUNT: tl.constexpr):
    """One round's decision. W is non-increasing in t (sums over a shrinking set, same order),
    so the pivots with W >= target are the low ones: the largest gives lo, the smallest
    failing one gives pv; both snap onto data values."""
    if USE_COUNT:
        w = cnt
    else:
        w = mass
    ok = w >= target
    # the four in one reduction (exact in any order): one exchange a round, not four
    n_ok, lo_ok, mass_ok, pv_fail = tl.reduce(
        (ok.to(tl.int32), tl.where(ok, nxt, float("-inf")), tl.where(ok, mass, float("inf")),
         tl.where(ok, float("inf"), prv)), 0, _add_max_min_min)
    lo = tl.where(n_ok > 0, lo_ok, lo)
    lo_mass = tl.where(n_ok > 0, mass_ok, lo_mass)
    pv = tl.where(n_ok < NPIV, pv_fail, pv)
    return lo, pv, lo_mass


@triton.jit
def _pivot_init(NPIV: tl.constexpr):
    cnt = tl.zeros([NPIV], dtype=tl.float32)
    mass = tl.zeros([NPIV], dtype=tl.float32)
    nxt = tl.full([NPIV], float("inf"), dtype=tl.float32)
    prv = tl.full([NPIV], float("-inf"), dtype=tl.float32)
    return cnt, mass, nxt, prv
