"""Rows of different lengths on one shared cache: the slot bookkeeping of assisted decoding.

A :class:`~gpu_sampler.hf.buffers.Buffers` holds one cache whose length (``bufs.kv`` slots) is
shared by every row, and per slot a 2-D attention mask and the position ids. Row b's tokens
are the slots whose mask is 1, at their own positions (``bufs.next_pos[b]`` is where its next
fed token goes), so rows may advance by different counts:

* :func:`feed` writes W tokens per row at slots kv .. kv+W-1 with positions next_pos + j (the
  first step feeds the prompt too, with its own mask and positions);
* :func:`settle` keeps the first ``keep[b]`` of the slots fed since a mark: when every row keeps
  the same count the rejected slots are simply cropped off (``cache.crop``); otherwise the
  dropped slots are masked and :func:`compact` packs every row's kept slots to the right end
  of the shortest span in place (``StaticKVCache.gather_positions``), like left padding. The
  cache is never grown by concatenation nor reallocated to roll back;
* :func:`returned_cache` lays the cache out again as sequence columns (row b's prompt where
  its prompt was, then its tokens) in the DynamicCache transformers returns.

A masked slot is invisible to attention, and every kept token keeps its position id (and its
rotary / absolute position in the stored keys), so a row computes what it would alone. ALiBi
models (Bloom, Falcon) build their bias from the mask's cumulative sum, which skips masked
slots the same way.
"""
import torch
from transformers.cache_utils import DynamicCache

__all__ = ["feed", "settle", "compact", "returned_cache"]


def feed(model, plan, bufs, ids, skip=0):
    """One forward over ``ids`` [B, W] for every row at slots kv .. kv+W-1: float32 logits
    [B, W - skip, V] of the last W - skip. Those get mask 1 and positions next_pos + 0, 1, ...;
    the first `skip` (the prompt, fed with the first drafts) keep the mask and positions the
    buffers hold. ``next_pos`` is left to the caller."""
    B, W = ids.shape
    kv = bufs.kv
    bufs.ensure_room(model, plan, kv + W, 0)
    bufs.mask[:, kv + skip:kv + W] = 1
    bufs.pos[..., kv + skip:kv + W] = (bufs.next_pos[..., None]
                                       + torch.arange(W - skip, device=ids.device))
    kw = bufs.model_inputs(plan, W, ids=ids, prefill=skip > 0)
    if "logits_to_keep" in kw:
        kw["logits_to_keep"] = W - skip
    logits = model(**kw).logits[:, skip - W:]
    bufs.kv += W
    return logits.to(torch.float32)


def settle(bufs, start, keep, live):
    """Row b keeps the first ``keep[b]`` (int64 [B]) slots fed since slot `start`; rows not
    ``live`` (bool [B], finished) keep whatever costs nothing: the live rows' count when those
    agree, else none. Returns True when the cache was packed (live rows kept different
    counts)."""
    dev = bufs.mask.device
    keep, live = keep.to(dev), live.to(dev)
    top = int(keep[live].max()) if bool(live.any()) else 0
    if bool((keep[live] == top).all()):
        if start + top < bufs.kv:
            bufs.cache.crop(start + top - bufs.kv)
        bufs.kv = start + top
        return False
    keep = torch.where(live, keep, 0)
    dropped = torch.arange(bufs.kv - start, device=dev)[None, :] >= keep[:, None]
    bufs.mask[:, start:bufs.kv].masked_fill_(dropped, 0)
    compact(bufs)
    return True


def compact(bufs):
    """Pack each row's attended slots (mask 1) to the right end of the shortest span that
    holds them all, in order; the cache, mask and positions move together."""
    kv = bufs.kv
    live = bufs.mask[:, :kv] != 0
    top = int(live.sum(1).max())
    # Stable sort: masked slots first, then the attended ones in their order.
    order = torch.argsort(live.to(torch.int8), dim=1, stable=True)[:, kv - top:]
    bufs.cache.gather_positions(order)
    bufs.mask[:, :top] = bufs.mask[:, :kv].gather(1, order)
    bufs.mask[:, top:] = 1
    pos = bufs.pos[..., :kv]
    bufs.pos[..., :top] = pos.gather(-1, order.expand(*pos.shape[:-1], top))
    bufs.kv = top


def returned_cache(model, bufs, inputs, length, packed):
    """The DynamicCache of `length` positions per row that plain generate would return: row
    b's prompt slots where its prompt (left-padded) had them, then its tokens. `packed`: the
    slots were rearranged (:func:`compact`) and must be laid out again; positions no token of
    the row holds are zeros."""
    if not packed:
        return bufs.returned_cache(model, inputs.B, length)
    kv = bufs.kv
    live = bufs.mask[:, :kv] != 0
    order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)  # attended first
    first = inputs.P - (inputs.mask != 0).sum(1).to(live.device)   # row b's first column
    j = torch.arange(length, device=live.device)[None, :] - first[:, None]
    used = (j >= 0) & (j < live.sum(1)[:, None])
    index = order.gather(1, j.clamp(0, kv - 1))
    dynamic = DynamicCache(config=model.config)
    for idx, kv_pair in enumerate(bufs.cache.gathered(index)):
        if kv_pair is not None:
            w = used[:, None, :, None].to(kv_pair[0].dtype)
            dynamic.update(kv_pair[0] * w, kv_pair[1] * w, idx)
    return dynamic
