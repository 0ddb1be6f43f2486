"""What a generate() call allocates for its decode loop, and how it grows.

The working KV cache (our :class:`~gpu_sampler.hf.cache.StaticKVCache` standing in for
transformers' default ``DynamicCache``, or the cache transformers would use) and the per-row
buffers beside it: attention mask, positions (``[..., B, kv]``: Qwen2-VL's are 4 rows deep),
per-position inputs (token types) over kv positions; returned tokens
and penalty history over sequence columns. Our cache and the buffers start with room for
``_INITIAL_NEW_POSITIONS`` new tokens and double between steps when full (never per token), so
a huge max_new_tokens used as "no limit" costs memory only for what is generated.
"""
import dataclasses
from typing import Optional

import torch
from transformers.cache_utils import Cache, DynamicCache

from . import compat
from .cache import StaticKVCache
from .common import history_skip, own_cache, prompt_history_mask

__all__ = ["Buffers"]

# New positions the buffers hold before the first doubling.
_INITIAL_NEW_POSITIONS = 256


def _grow_cache(model, cache, B, length):
    """The cache with room for `length` positions, contents kept (cache.grow when it has one)."""
    if hasattr(cache, "grow"):
        cache.grow(length)
        return cache
    bigger = StaticKVCache(model.config, B, length)
    for old, new in zip(cache.layers, bigger.layers):
        if old.is_initialized:
            n = old.get_seq_length()
            new.update(old.keys[:B, :, :n], old.values[:B, :, :n])
    return bigger


def _grow_rows(buf, length, fill):
    """`buf` [..., n] widened to [..., length] along its last dimension."""
    bigger = buf.new_full((*buf.shape[:-1], length), fill)
    bigger[..., :buf.shape[-1]] = buf
    return bigger


def _working_cache(model, plan, kv_cap):
    """(cache, ours): the cache the loop runs on, and whether it is our growing stand-in."""
    inp, gc = plan.inputs, plan.gc
    if inp.cache is not None or gc.use_cache is False:
        return inp.cache, False
    if gc.cache_implementation not in (None, "dynamic"):
        # transformers' own cache for this implementation ("static", ...): same type, same
        # (sticky) length as model.generate would use.
        made = {}
        model._prepare_cache_for_generation(gc, made, None, inp.B0, inp.kv_total)
        return compat.pop_cache(made), False
    # Our cache stands in for transformers' DynamicCache and is converted at the end when
    # returned; sliding layers keep only a window, so then run on the real type. Built lazily,
    # so checking the config at the final length allocates nothing. Returned attention weights
    # must span the written positions only, as with a DynamicCache (padding rows' uniform
    # weights depend on the span, and so do their hidden states): run on one.
    full = None if plan.want_attn or plan.want_hidden else own_cache(model, inp.B, inp.kv_total)
    if full is None or (gc.return_dict_in_generate and any(full.is_sliding)):
        dynamic = DynamicCache(config=model.config)
        if gc.is_assistant and hasattr(dynamic, "activate_past_recording"):
            # As transformers marks an assistant's new cache: its assisted decoding crops it
            # back each round, past a sliding window too.
            dynamic.activate_past_recording()
        return dynamic, False
    return own_cache(model, inp.B, kv_cap), True


@dataclasses.dataclass(eq=False)
class Buffers:
    """The decode loop's growing state. kv positions index `mask`, `pos`, `tt` (and the cache);
    sequence columns index `out` and `hist`."""
    cache: Optional[Cache]           # None with use_cache=False: the whole sequence each step
    own: bool                        # `cache` is our StaticKVCache stand-in (grown, converted)
    cache_cap: int                   # positions our cache has room for (0 when not ours)
    kv: int                          # positions the cache holds
    mask: torch.Tensor               # [B, kv capacity] attention mask, 1 beyond the prompt
    pos: torch.Tensor                # [..., B, kv capacity] position ids
    next_pos: torch.Tensor           # [..., B] position of the next fed token
    typed: dict                      # name -> [B, kv capacity] per-position input (token types)
    typed_new: dict                  # name -> [B, 1] the value every generated token gets
    out: torch.Tensor                # [B, seq capacity] returned sequences
    hist: torch.Tensor               # [B, seq capacity] penalty history, -1 = ignored
    ignored: torch.Tensor            # [B] history columns before this one stay -1
    fixed_kw: dict = dataclasses.field(default_factory=dict)  # forward kwargs fixed per cache
    static_len: int = 0              # the mask length a static cache attends over

    @classmethod
    def allocate(cls, model, plan):
        inp = plan.inputs
        kv_cap = min(inp.kv_total, inp.P + _INITIAL_NEW_POSITIONS)
        cache, own = _working_cache(model, plan, kv_cap)
        if cache is not None and not own and cache.is_compileable and cache.get_max_length() > 0:
            fixed = cache.get_max_length()
            if not any(cache.is_sliding) and fixed < inp.kv_total:
                raise ValueError(f"past_key_values holds at most {fixed} positions but this call "
                                 f"needs {inp.kv_total} (max_length {inp.gc.max_length})")
            kv_cap = max(kv_cap, fixed)
        pos, next_pos = _positions(inp, kv_cap)
        typed, typed_new = plan.step.per_position(inp.P, kv_cap)
        out, hist, ignored = _sequences(inp, min(inp.gc.max_length,
                                                 inp.L0 + _INITIAL_NEW_POSITIONS))
        ignored = history_skip(ignored, inp.L0, plan.sample_kw)
        mask = inp.mask.new_ones(inp.B, kv_cap)
        mask[:, :inp.P] = inp.mask
        bufs = cls(cache=cache, own=own, cache_cap=kv_cap if own else 0, kv=inp.past,
                   mask=mask, pos=pos, next_pos=next_pos, typed=typed, typed_new=typed_new, out=out,
                   hist=hist, ignored=ignored)
        bufs.refresh_fixed_inputs(plan)
        if plan.amateur is not None and cache is not None:
            plan.amateur.start(inp.B, mask.shape[1])
        return bufs

    def ensure_room(self, model, plan, kv_need, seq_need):
        """Double the buffers (and our cache) that cannot hold the next step; between steps."""
        inp = plan.inputs
        if self.own and kv_need > self.cache_cap:
            self.cache_cap = min(inp.kv_total, max(kv_need, 2 * self.cache_cap))
            self.cache = _grow_cache(model, self.cache, inp.B, self.cache_cap)
            self.refresh_fixed_inputs(plan)
            self.mark_static(plan)
        kv_cap = max(kv_need, self.cache_cap if self.own else 0)
        if kv_cap > self.mask.shape[1]:
            kv_cap = max(kv_cap, min(2 * self.mask.shape[1], max(inp.kv_total, kv_need)))
            self.mask = _grow_rows(self.mask, kv_cap, 1)
            if plan.amateur is not None:
                plan.amateur.grow(kv_cap)
            self.pos = _grow_rows(self.pos, kv_cap, 0)
            for name, buf in self.typed.items():
                self.typed[name] = _grow_rows(buf, kv_cap, 0)
                self.typed[name][:, buf.shape[1]:] = self.typed_new[name]
            self.mark_static(plan)
        if seq_need > self.out.shape[1]:
            cap = min(inp.gc.max_length, max(seq_need, 2 * self.out.shape[1]))
            self.out = _grow_rows(self.out, cap, 0)
            self.hist = _grow_rows(self.hist, cap, -1)

    def mark_static(self, plan):
        if not plan.compile:
            return
        # The buffers are mutated in place by every step: a fixed address lets CUDA graphs
        # replay instead of being skipped for mutated inputs.
        if self.own:
            for layer in self.cache.layers:
                if layer.is_initialized:
                    torch._dynamo.mark_static_address(layer.keys)
                    torch._dynamo.mark_static_address(layer.values)
        torch._dynamo.mark_static_address(self.mask)

    def refresh_fixed_inputs(self, plan):
        """The forward arguments that change only when the cache is replaced (growth)."""
        kw = {"use_cache": self.cache is not None}
        if self.cache is not None:
            kw[plan.cache_arg] = self.cache
        if plan.logits_to_keep is not None:
            kw["logits_to_keep"] = plan.logits_to_keep
        if plan.want_attn:
            kw["output_attentions"] = True
        if plan.want_hidden:
            kw["output_hidden_states"] = True
        self.fixed_kw = kw
        # A static cache attends over its whole length: the 2-D mask must be that long (ALiBi
        # models build their bias from it); unwritten slots are 1 and hidden by causality.
        static = self.cache is not None and self.cache.is_compileable
        self.static_len = self.cache.get_max_length() if static else 0

    def model_inputs(self, plan, q, ids=None, embeds=None, prefill=False):
        """Keyword arguments for one forward over `q` new positions starting at self.kv (the
        prefill's: with the inputs transformers forwards at the prefill only)."""
        kw = dict(self.fixed_kw)
        if embeds is not None:
            kw["inputs_embeds"] = embeds
        else:
            kw["input_ids"] = ids
        start = self.kv
        if self.cache is None:
            start, q, prefill = 0, self.kv + q, True  # no cache: the whole sequence every step
        end = start + q
        step = plan.step
        if plan.takes_mask and (prefill or step.decode_mask):
            kw["attention_mask"] = self.mask[:, :max(end, self.static_len)]
        if plan.takes_pos:
            pos = self.pos[..., start:end]
            kw["position_ids"] = pos + step.pos_offset if step.pos_offset else pos
        for name, buf in self.typed.items():
            if prefill or name in step.decode_typed:
                kw[name] = buf[:, start:end]
        kw.update(step.every)
        if prefill:
            kw.update(step.prefill)
        return kw

    def text_next_pos(self):
        """[B] the next fed token's (text) position: the first row of deeper positions."""
        return self.next_pos.reshape(-1, self.next_pos.shape[-1])[0]

    def append(self, column, tok):
        self.out[:, column] = tok
        self.hist[:, column] = tok.masked_fill(self.ignored > column, -1)

    def advance(self):
        """One decode step fed one position."""
        self.kv += 1
        self.next_pos = self.next_pos + 1

    def returned_cache(self, model, B, length):
        """What transformers returns as past_key_values: our stand-in becomes a DynamicCache."""
        if not self.own:
            return self.cache
        return self.cache.to_dynamic(model.config, B, length)


def _positions(inp, kv_cap):
    """([..., B, kv_cap] position ids with the prompt's, [..., B] the next position)."""
    given = inp.model_kwargs["position_ids"]
    pos = torch.zeros(*given.shape[:-1], kv_cap, dtype=torch.long, device=inp.device)
    k = min(inp.P, given.shape[-1])
    pos[..., inp.P - k:inp.P] = given[..., given.shape[-1] - k:]
    return pos, given[..., -1] + 1


def _sequences(inp, seq_cap):
    """([B, seq_cap] returned tokens, [B, seq_cap] penalty history holding the prompt, [B]
    the first history column the penalty sees)."""
    out = torch.empty(inp.B, seq_cap, dtype=torch.long, device=inp.device)
    out[:, :inp.L0] = inp.input_ids
    # Penalty history: not-yet-generated slots are -1, which sample() ignores, and so are the
    # columns before the whole mask's first attended position: transformers'
    # prompt_ignore_length, counted on the sequences (left padding; from inputs_embeds or a
    # filled cache the sequences start later than the mask, and transformers still counts so).
    hist = torch.full((inp.B, seq_cap), -1, dtype=torch.long, device=inp.device)
    ignored = (inp.mask != 0).int().argmax(dim=1)
    if inp.L0:
        pad = prompt_history_mask(inp.mask, inp.L0)
        hist[:, :inp.L0] = inp.input_ids.masked_fill(pad, -1)
    return out, hist, ignored
