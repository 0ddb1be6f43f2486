"""Penalty pre-step: bucket a row's history ids by statistics block, reading them twice.

The statistics kernel works on TILE-wide blocks of the vocabulary. Instead of every block scanning
the whole [L] history (L x V / TILE reads), this kernel writes the history once more as an edit
list grouped by block, so that block t reads only the entries of its own tokens:

    code_j  = id_j * 2 + [j >= prompt_len]        (int32; ids < 0 are padding and dropped)
    edits   = the codes, stably grouped by block id_j // TILE
    bounds  = [start_t] and [end_t] of each block's slice

Read 1 counts the entries per block (a histogram), an exclusive prefix sum gives the starts;
read 2 writes each entry at start[block] + (entries of its block before it). The within-block
rank in a history tile comes from sorting the tile by (block, position): O(L_BLOCK log^2
L_BLOCK) per tile whatever the vocabulary, deterministic (no atomics) and stable. (A one-hot
[L_BLOCK, NT_P2] cumsum does the same in O(L_BLOCK * NT_P2): modelled 210 us at L = 4096,
V = 128256.) The launcher uses 256-id tiles, 1024 when L > 2048 (fewer latency-bound rounds:
modelled 35 -> 21 us at L = 4096, one program per row).
History bytes: exactly 2 * L * itemsize per row; edits: L * 4 written.
"""
import triton
import triton.language as tl

from .common import _param


@triton.jit(do_not_specialize=["L", "plen_s"])
def _bucket_history_kernel(ids_ptr, stride_ib, L, plen_ptr, plen_s, edits_ptr, bnd_ptr, NT,
                           PLEN_T: tl.constexpr, TILE: tl.constexpr, L_BLOCK: tl.constexpr,
                           NT_P2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    irow = ids_ptr + row * stride_ib
    erow = edits_ptr + row * L
    plen = _param(plen_ptr, plen_s, row, PLEN_T, tl.int64)
    bins = tl.arange(0, NT_P2)

    # read 1: entries per block
    count = tl.zeros([NT_P2], dtype=tl.int32)
    for h0 in range(0, L, L_BLOCK):
        hoffs = h0 + tl.arange(0, L_BLOCK)
        hin = hoffs < L
        ids = tl.load(irow + hoffs, mask=hin, other=-1).to(tl.int64)
        ok = hin & (ids >= 0) & (ids < NT * TILE)  # ids >= V (check=False) touch nothing
        blk = tl.where(ok, ids // TILE, 0).to(tl.int32)
        count += tl.histogram(blk, NT_P2, mask=ok)
    cursor = tl.cumsum(count, 0) - count
    tl.store(bnd_ptr + row * 2 * NT + bins, cursor, mask=bins < NT)
    tl.store(bnd_ptr + row * 2 * NT + NT + bins, cursor + count, mask=bins < NT)

    # read 2: scatter each entry into its block's slice, in history order. Sorting the tile by
    # (block, lane) groups it by block and keeps history order inside a block (the keys are
    # unique); an entry's rank in its group is its sorted index minus the group's start.
    lane = tl.arange(0, L_BLOCK)
    for h0 in range(0, L, L_BLOCK):
        hoffs = h0 + lane
        hin = hoffs < L
        ids = tl.load(irow + hoffs, mask=hin, other=-1).to(tl.int64)
        ok = hin & (ids >= 0) & (ids < NT * TILE)  # ids >= V (check=False) touch nothing
        blk = tl.where(ok, ids // TILE, NT_P2).to(tl.int32)  # dropped entries sort last
        cnt = tl.histogram(tl.where(ok, blk, 0), NT_P2, mask=ok)
        skey = tl.sort(blk * L_BLOCK + lane)
        sblk = skey // L_BLOCK
        sok = sblk < NT_P2
        g = tl.minimum(sblk, NT_P2 - 1)
        start = tl.gather(tl.cumsum(cnt, 0) - cnt, g, 0)
        pos = tl.gather(cursor, g, 0) + (lane - start)
        code = (ids * 2 + (hoffs >= plen).to(tl.int64)).to(tl.int32)
        tl.store(erow + pos, tl.gather(code, skey % L_BLOCK, 0), mask=sok)
        cursor += cnt
