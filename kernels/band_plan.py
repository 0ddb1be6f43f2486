"""The band read's plan, run by the merge for each row it hands to the band read (kernels/band.py):
from stage 1's per-block bin counts, the band [Ja, Jc] of row bins that holds tau and at most
CAP tokens, and each block's offset into the band list. No logits.

Row bins J = j + (Fmax - F_t) (block t's bin j, F_t its top bin, Fmax the row's); the row's
count per row bin J < JW in one pass over the [NT, 128] counts (gather loads of each block's
bins at its shift); each bin's mass estimated at a uniform density,
count e^((Fmax - J) / 8 - M) 8 (e^(1/8) - 1); the smallest row edge E with
Z - W_est(J >= E) >= p Z (one reverse cumsum), Jb = E - 1; the band [Jb - a, Jb + c]
(a + c <= GROW) of <= CAP tokens with the largest min(a, c), then a + c, all pairs at once
from the prefix counts; per-block offsets = the exclusive cumsum of the blocks' band counts.
The band fails (the row pass, in the band finish) when Jb alone holds more than CAP tokens or
|Fmax| is not below F_BAND_MAX (2^23: not finite, or bins no longer exact).

Reads 2 NT NBIN bytes of counts twice and 4 NT bytes of F_t (from L2); writes 4 floats and 5
ints per row, 4 bytes per block, and resets the row's bucket table (8 KB). (A launch of its own
until the twelfth session: folded into the merge, which has M and Z, it saves a launch on every
call compiled for the band read.)
"""
import triton
import triton.language as tl

from .common import BAND_S, NBIN, _band_shift, _screen_bound

# a row the merge hands to the band read is flagged with token BAND_ROW; its plan: float32
# [B, NBF] (M, Z, Fmax, the draw's screen bound S) and int32 [B, NBI] (band found, its row bins
# [Ja, Jc], its token count, the finish's ticket counter: its programs of the row that are done)
BAND_ROW = tl.constexpr(-3)
B_M, B_Z, B_FMAX, B_SLB = (tl.constexpr(i) for i in range(4))
NBF = tl.constexpr(4)
I_OK, I_JA, I_JC, I_N, I_TICK = (tl.constexpr(i) for i in range(5))
NBI = tl.constexpr(5)
# the largest |Fmax| the plan takes (|x| < 2^20 after the temperature): below 2^24 every bin
# is exact (common._band_bin), and a block whose F is past 2^24 lies > 2^20 units below Fmax,
# shifted out of the window (SHIFT_MAX); NaN and inf fail too. Such a row takes the row pass.
F_BAND_MAX = tl.constexpr(8388608.0)
# the plan's window of row bins: J < JW, 32 units of x below the row's top bin (a bin past it
# is estimated at most V e^-32 of Z: never the boundary for V < 2^22 at any fp32 p < 1)
JW = tl.constexpr(256)
# the band's bins at most (GROW + 1 <= GW): the width of the band choice and of the offsets
GW = tl.constexpr(32)
# 8 (e^(1/8) - 1): a bin's mass over its lower edge's e^(x - M), uniform density
BIN_MASS = tl.constexpr(1.0651876887826498)
# the band's bucket table (kernels/band.py), int64 [B, NBUCK]: bucket q = floor(x QR) - qb,
# clamped to [0, NBUCK), qb = floor(x_lo QR) - Q_SLACK with x_lo the band's lower bin edge in
# x (a band of GROW + 1 bins spans 17 / 8 units of x: NBUCK / QR = 4); per bucket the
# fixed-point mass of its tokens (e 2^47, e <= 1, truncated: integer sums, the same in any
# order). The plan resets a row's table: the gather's atomics add to it.
NBUCK = tl.constexpr(1024)
QR = tl.constexpr(256.0)
Q_SLACK = tl.constexpr(64.0)
FX = tl.constexpr(140737488355328.0)  # 2^47: CAP < 2^16 tokens of e <= 1 sum below 2^63


@triton.jit
def _band_screen_bound(p, Z, lminp):
    """S, the bound the band read screens its draw against (common.py, "the draw's screen"):
    top-p keeps W_kept >= p Z; -inf (no screen) with min-p, whose cut can leave less kept."""
    return tl.where(lminp > float("-inf"), float("-inf"), _screen_bound(p * Z))


@triton.jit
def _row_counts(hrow, frow, NT, fmax, TB: tl.constexpr):
    """The row's token count per row bin J < JW, one pass over the [NT, NBIN] counts (2 NT NBIN
    bytes from L2): block t's bin j is row bin J = j + shift_t, so each chunk of TB blocks
    loads h[t, J - shift_t] for every J of the window, a gather load: no scatter-add (the
    first plan re-read the counts once per bisection step and per grow step, 25 passes).
    A chunk is one flat [JW TB] tile, lane e = J TB + (t - t0): a thread's lanes are 256 apart,
    so they all hold one block (its top, shift and row address once a chunk, one add and an
    immediate offset a lane; a 2-D tile put the block on the lanes' axis and redid them on
    every lane), and the lanes' sums are reduced over the blocks once, at the end. The next
    chunk's counts and the one after's tops are in flight while a chunk is summed (the
    merge's one program per row waits on every load)."""
    e = tl.arange(0, JW * TB)
    tk = e % TB
    J = e // TB
    acc = tl.zeros([JW * TB], tl.int32)
    h = _chunk_counts(hrow, fmax, _chunk_tops(frow, NT, 0, TB), tk, J, TB)
    F = _chunk_tops(frow, NT, TB, TB)
    for t0 in range(TB, NT + TB, TB):
        h_n = _chunk_counts(hrow, fmax, F, t0 + tk, J, TB)
        F = _chunk_tops(frow, NT, t0 + TB, TB)
        acc += h.to(tl.int32)
        h = h_n
    return tl.sum(tl.reshape(acc, [JW, TB]), axis=1)


@triton.jit
def _chunk_tops(frow, NT, t0, TB: tl.constexpr):
    """F_t of blocks [t0, t0 + TB) (-inf past NT)."""
    tb = t0 + tl.arange(0, TB)
    return tl.load(frow + tb, mask=tb < NT, other=float("-inf"))


@triton.jit
def _chunk_counts(hrow, fmax, F, tb, J, TB: tl.constexpr):
    """Block tb's count at row bin J, lane by lane: h[t, J - shift_t], 0 outside (a block past
    NT has F = -inf, shift = SHIFT_MAX: no j in range). F [TB] reaches the lanes as one
    shift a thread (broadcast, then the lane order of the flat tile)."""
    sh = tl.reshape(tl.broadcast_to(_band_shift(fmax, F)[None, :], [JW, TB]), [JW * TB])
    j = J - sh
    return tl.load((hrow + (tb * NBIN - sh)) + J, mask=(j >= 0) & (j < NBIN), other=0)


@triton.jit
def _boundary_bin(cnt, fmax, M, Z, p):
    """Jb = E - 1, E the smallest row edge with Z - W_est(J >= E) >= p Z, W_est(J >= E) the
    suffix sum of cnt[J] e^((Fmax - J) / 8 - M) BIN_MASS over the window (non-increasing in
    E, 0 at JW, so E <= JW): one scan, no bisection."""
    J = tl.arange(0, JW)
    w = cnt.to(tl.float32) * (tl.exp((fmax - J.to(tl.float32)) * (1.0 / BAND_S) - M) * BIN_MASS)
    tail = tl.cumsum(w, 0, reverse=True)
    E = tl.min(tl.where(Z - tail >= p * Z, J, JW), axis=0)
    return tl.maximum(E - 1, 0)


@triton.jit
def _choose_band(cnt, jb, CAP, GROW: tl.constexpr):
    """[Ja, Jc] = [Jb - a, Jb + c] with a + c <= GROW inside the window holding <= CAP
    tokens, the most balanced first (max min(a, c), then a + c, then a): the estimate errs on
    both sides. All (a, c) at once from the prefix counts (the first plan grew the band a bin
    at a time, a pass over the counts per step). Returns (Ja, Jc, count, the band exists)."""
    incl = tl.cumsum(cnt, 0)
    i = tl.arange(0, GW)
    pa = tl.gather(incl - cnt, tl.minimum(tl.maximum(jb - i, 0), JW - 1), 0)  # tokens J < Ja
    qc = tl.gather(incl, tl.minimum(jb + i, JW - 1), 0)  # tokens J <= Jc
    a = i[:, None]
    c = i[None, :]
    n2 = qc[None, :] - pa[:, None]
    ok = (a + c <= GROW) & (jb - a >= 0) & (jb + c < JW) & (n2 <= CAP)
    score = tl.where(ok, (tl.minimum(a, c) * 64 + a + c) * 64 + a, -1)
    best = tl.max(tl.max(score, axis=1), axis=0)
    n = tl.sum(tl.sum(tl.where(score == best, n2, 0), axis=1), axis=0)
    ba = best % 64
    return jb - ba, jb + (best // 64) % 64 - ba, n, best >= 0


@triton.jit
def _band_offsets(hrow, frow, orow, NT, fmax, ja, jc, OB: tl.constexpr):
    """Per block, the exclusive cumsum (block order) of its tokens in row bins [Ja, Jc]: where
    the gather appends its band tokens. One gather load of GW bins per block. Returns the
    band's token count."""
    i = tl.arange(0, GW)
    carry = tl.zeros([], tl.int32)
    for t0 in range(0, NT, OB):
        tb = t0 + tl.arange(0, OB)
        F = tl.load(frow + tb, mask=tb < NT, other=float("-inf"))
        j = (ja + i)[None, :] - _band_shift(fmax, F)[:, None]
        ok = (tb < NT)[:, None] & (i[None, :] <= jc - ja) & (j >= 0) & (j < NBIN)
        bc = tl.sum(tl.load(hrow + tb[:, None] * NBIN + j, mask=ok, other=0).to(tl.int32),
                    axis=1)
        tl.store(orow + tb, carry + tl.cumsum(bc, 0) - bc, mask=tb < NT)
        carry += tl.sum(bc, axis=0)
    return carry


# chunks of blocks per step: the row counts (TB x JW loads) and the offsets (OB x GW loads)
TB = tl.constexpr(16)
OB = tl.constexpr(128)
GROW = tl.constexpr(16)


@triton.jit
def _plan_row(hrow, frow, orow, bfrow, birow, tabrow, NT, CAP, M, Z, p, lminp,
              NT_P2: tl.constexpr):
    """Plan one band row (module docstring) from its counts hrow [NT, NBIN] and tops frow [NT],
    with the merge's M and Z: writes the block offsets (orow), (M, Z, Fmax, S) and (ok, Ja, Jc,
    count), and resets the row's bucket table (tabrow [NBUCK])."""
    tt = tl.arange(0, NT_P2)
    fmax = tl.max(tl.load(frow + tt, mask=tt < NT, other=float("-inf")), axis=0)
    cnt = _row_counts(hrow, frow, NT, fmax, TB)
    jb = _boundary_bin(cnt, fmax, M, Z, p)
    ja, jc, _n, ok = _choose_band(cnt, jb, CAP, GROW)
    ok = ok & (tl.abs(fmax) < F_BAND_MAX)
    n = _band_offsets(hrow, frow, orow, NT, fmax, ja, jc, OB)
    tl.store(bfrow + B_M, M)
    tl.store(bfrow + B_Z, Z)
    tl.store(bfrow + B_FMAX, fmax)
    tl.store(bfrow + B_SLB, _band_screen_bound(p, Z, lminp))
    tl.store(birow + I_OK, ok.to(tl.int32))
    tl.store(birow + I_JA, ja)
    tl.store(birow + I_JC, jc)
    tl.store(birow + I_N, n)
    tl.store(birow + I_TICK, 0)
    q = tl.arange(0, NBUCK)
    tl.store(tabrow + q, tl.zeros([NBUCK], tl.int64))
