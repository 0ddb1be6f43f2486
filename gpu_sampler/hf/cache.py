"""A preallocated key/value cache that transformers models accept as ``past_key_values``.

Layer types follow transformers' own ``StaticCache`` (``config.layer_types`` / ``sliding_window``):

* full attention: one [max_batch_size, H_kv, max_cache_len, head_dim] buffer each for keys and
  values, written with a slice copy at the current position (no reallocation, no concatenation);
* sliding-window (and chunked) attention: a ring buffer of the window, written in place. Each
  position is stored twice (slot ``p % W`` and ``p % W + W`` of a 2W buffer) so the last W
  positions are always one contiguous view in position order: decoding copies nothing.

GPT-Neo's local layers slice their window mask by key length, and Falcon's ALiBi bias is built
from the 2-D mask transformers grows by one per step, so for those every layer hands the model
a view of exactly the positions seen so far (the storage is still preallocated).
A smaller batch works on a leading view of the same storage.
"""
import torch
from transformers.cache_utils import (Cache, CacheLayerMixin, DynamicCache,
                                      get_layer_types_and_kwargs)

__all__ = ["StaticKVCache"]


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _layer_plan(config):
    """[(kind, window)] per layer, kind in {"full", "sliding", "exact"}; refuse anything else."""
    model_type = getattr(config, "model_type", type(config).__name__)
    attention_layers = getattr(config, "attention_layers", None)
    if model_type == "gpt_neo" and "local" in (attention_layers or ()):
        # GPT-Neo masks its local layers with `bias[key_len - q_len : key_len]`, which is only
        # right when the keys are exactly the positions seen so far; its global layers share
        # the same 4-D mask, so every layer must return that length.
        return [("exact", None) for _ in attention_layers]
    if model_type == "falcon" and getattr(config, "alibi", False):
        # Falcon builds its ALiBi bias from the 2-D attention mask, which transformers' generate
        # grows by one per step: the keys must have that same length.
        return [("exact", None) for _ in range(config.num_hidden_layers)]
    layer_types, layer_kwargs = get_layer_types_and_kwargs(config)
    if isinstance(layer_kwargs, dict):
        # transformers <= 5.17 returns one kwargs dict shared by every layer (a list per layer
        # since); zipping the dict would pair layers with its keys and drop layers.
        layer_kwargs = [layer_kwargs] * len(layer_types)
    plan = []
    for t, kw in zip(layer_types, layer_kwargs):
        if t == "full_attention":
            plan.append(("full", None))
        elif t in ("sliding_attention", "chunked_attention"):
            # A chunk never reaches further back than chunk_size - 1 positions, so a ring of the
            # chunk serves it; the chunked mask (built from these same sizes) does the rest.
            plan.append(("sliding", int(kw["sliding_window"])))
        else:
            raise NotImplementedError(
                f"StaticKVCache does not support {t!r} layers (model_type={model_type!r}); "
                f"use transformers' own cache for this model")
    return plan


def _kv_layout(config):
    """(kv_heads, k_head_dim, v_head_dim) of the states the model's attention writes."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if getattr(config, "model_type", None) == "falcon":
        # FalconAttention: the new architecture broadcasts k/v to every query head before the
        # cache; the old one writes one head with multi_query, else num_kv_heads.
        if config.new_decoder_architecture:
            return heads, head_dim, head_dim
        kv = 1 if config.multi_query else config.num_kv_heads
        return kv, head_dim, head_dim
    kv = getattr(config, "num_key_value_heads", None) or heads
    return kv, head_dim, head_dim


class StaticKVLayer(CacheLayerMixin):
    """A full-attention layer of :class:`StaticKVCache` (keys/values [B_max, H_kv, T_max, D]).

    ``exact_length=True`` returns (and sizes masks for) only the positions written so far,
    for models whose attention depends on the key length (GPT-Neo local, Falcon ALiBi).
    """

    # Mask code keys off this flag: a compileable cache always gets an explicit mask for
    # single-token queries, which a cache with unwritten (future) slots needs to be correct.
    is_compileable = True
    is_sliding = False
    is_croppable = True  # transformers >= 5.24 asks before assisted decoding rolls back

    def __init__(self, max_batch_size, max_cache_len, exact_length=False):
        super().__init__()
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.exact_length = exact_length
        if exact_length:
            # Shapes change every step, like a DynamicCache: transformers' generate must then
            # pass the 2-D mask (which ALiBi models build their bias from), not a static 4-D one.
            self.is_compileable = False
        # Python ints: positions are known on the host, so slicing needs no device sync.
        self.cumulative_length = 0
        self.rows = 0  # batch rows last written (beam search reorders these in place)

    def _slots(self):
        return self.max_cache_len

    def _used_slots(self):
        return self.cumulative_length

    def _allocate(self, num_heads, k_dim, v_dim, dtype, device):
        self.dtype, self.device = dtype, torch.device(device)
        self.num_heads = num_heads
        shape = (self.max_batch_size, num_heads, self._slots())
        self.keys = torch.zeros(*shape, k_dim, dtype=dtype, device=device)
        self.values = torch.zeros(*shape, v_dim, dtype=dtype, device=device)
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        self._allocate(key_states.shape[1], key_states.shape[-1], value_states.shape[-1],
                       key_states.dtype, key_states.device)

    def check_write(self, batch_size, n):
        """Raise ValueError if writing `n` positions for `batch_size` rows would not fit."""
        if batch_size > self.max_batch_size:
            raise ValueError(f"batch size {batch_size} exceeds the cache's max_batch_size="
                             f"{self.max_batch_size}")
        needed = self.cumulative_length + n
        if needed > self.max_cache_len:
            raise ValueError(f"the cache needs {needed} positions ({self.cumulative_length} "
                             f"cached + {n} new) but max_cache_len={self.max_cache_len}")

    def check_states(self, key_states, value_states):
        """Raise ValueError (nothing written) if the states cannot go into this layer's buffers."""
        self.check_write(key_states.shape[0], key_states.shape[-2])
        if not self.is_initialized:
            return
        if not _same_device(key_states.device, self.device):
            raise ValueError(f"the cache is on {self.device} but the key states are on "
                             f"{key_states.device}: create the cache on the model's device")
        same = (key_states.shape[1] == self.keys.shape[1]
                and key_states.shape[-1] == self.keys.shape[-1]
                and value_states.shape[-1] == self.values.shape[-1]
                and key_states.dtype == self.dtype)
        if not same and self.cumulative_length == 0:
            # An eager allocation that guessed the layout wrong: nothing is stored yet, so take
            # the model's layout instead of failing.
            self.is_initialized = False
            return
        if not same:
            raise ValueError(
                f"key states {tuple(key_states.shape)} {key_states.dtype} do not match the cache "
                f"layout [B, {self.keys.shape[1]}, T, {self.keys.shape[-1]}] {self.dtype}")

    def update(self, key_states, value_states, *args, **kwargs):
        self.check_states(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, n = key_states.shape[0], key_states.shape[-2]
        pos = self.cumulative_length
        # In-place slice write (dynamic_update_slice): no reallocation, no concatenation.
        self.keys[:b, :, pos:pos + n].copy_(key_states)
        self.values[:b, :, pos:pos + n].copy_(value_states)
        self.cumulative_length = pos + n
        self.rows = b
        if self.exact_length:
            return self.keys[:b, :, :pos + n], self.values[:b, :, :pos + n]
        return self.keys[:b], self.values[:b]

    def get_mask_sizes(self, query_length):
        if self.exact_length:
            return self.cumulative_length + query_length, 0
        # Attention spans the whole buffer; the causal mask hides unwritten slots.
        return self.max_cache_len, 0

    def get_seq_length(self):
        return self.cumulative_length

    def get_max_length(self):
        return self.max_cache_len

    def reset(self):
        # Stale entries beyond the position are never attended (causal mask), so only the
        # position is rewound; zeroing keeps the buffers tidy for inspection at little cost.
        if self.is_initialized:
            self.keys.zero_()
            self.values.zero_()
        self.cumulative_length = 0
        self.rows = 0

    def check_crop(self, tokens_to_remove):
        """Raise ValueError unless crop(tokens_to_remove) is possible (nothing changes)."""
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int) \
                or tokens_to_remove > 0:
            # transformers 5 semantics: a negative count of tokens to drop; positive is refused.
            raise ValueError(f"crop() takes a negative number of tokens to remove, got "
                             f"{tokens_to_remove!r}")

    def crop(self, tokens_to_remove):
        self.check_crop(tokens_to_remove)
        self.cumulative_length = max(0, self.cumulative_length + tokens_to_remove)

    def _resize(self, slots, copy):
        """Reallocate to `slots` positions, copying `copy` = [(dst, src)] slot ranges."""
        old_k, old_v = self.keys, self.values
        shape = (old_k.shape[0], old_k.shape[1], slots)
        self.keys = old_k.new_zeros(*shape, old_k.shape[-1])
        self.values = old_v.new_zeros(*shape, old_v.shape[-1])
        for (d0, d1), (s0, s1) in copy:
            self.keys[:, :, d0:d1].copy_(old_k[:, :, s0:s1])
            self.values[:, :, d0:d1].copy_(old_v[:, :, s0:s1])

    def grow(self, max_cache_len):
        if self.is_initialized:
            n = self.cumulative_length
            self._resize(max_cache_len, [((0, n), (0, n))])
        self.max_cache_len = max_cache_len

    def gathered(self, index):
        """(keys, values) copies [B, H, T, D] of the positions ``index`` (int64 [B, T]) names
        per row: position j of row b is this layer's position index[b, j]."""
        b, t = index.shape
        self.check_gather(index)
        idx = index.to(self.device)[:, None, :, None]
        n = self._used_slots()
        k = self.keys[:b, :, :n].gather(2, idx.expand(b, self.keys.shape[1], t,
                                                      self.keys.shape[-1]))
        v = self.values[:b, :, :n].gather(2, idx.expand(b, self.values.shape[1], t,
                                                        self.values.shape[-1]))
        return k, v

    def check_gather(self, index):
        """Raise ValueError unless ``gathered(index)`` reads written positions of this layer."""
        if index.dim() != 2 or index.shape[0] > self.max_batch_size:
            raise ValueError(f"index must be int64 [B, T] with B <= {self.max_batch_size}, got "
                             f"{tuple(index.shape)}")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.cumulative_length):
            raise ValueError(f"index must name written positions [0, {self.cumulative_length})")

    def gather_positions(self, index):
        """Rearrange every row's positions in place (see :meth:`gathered`); the layer then
        holds ``index.shape[1]`` positions."""
        k, v = self.gathered(index)
        b, t = index.shape
        self.keys[:b, :, :t].copy_(k)
        self.values[:b, :, :t].copy_(v)
        self.cumulative_length = t
        self.rows = b

    def _gather_rows(self, idx):
        """Rows idx[i] -> row i for i < len(idx), in the same storage."""
        if len(idx) > self.max_batch_size:
            raise ValueError(f"batch size {len(idx)} exceeds the cache's max_batch_size="
                             f"{self.max_batch_size}")
        if self.is_initialized:
            b, t = len(idx), self._used_slots()
            idx = idx.to(self.device)
            # index_select reads every source row into a temporary before the copy writes, so
            # overlapping rows are safe; only written slots are moved.
            self.keys[:b, :, :t].copy_(self.keys[:, :, :t].index_select(0, idx))
            self.values[:b, :, :t].copy_(self.values[:, :, :t].index_select(0, idx))
        self.rows = len(idx)

    def reorder_cache(self, beam_idx):
        self._gather_rows(torch.as_tensor(beam_idx, dtype=torch.long))

    def batch_repeat_interleave(self, repeats):
        self._gather_rows(torch.arange(self.rows).repeat_interleave(repeats))

    def batch_select_indices(self, indices):
        self._gather_rows(torch.as_tensor(indices, dtype=torch.long).flatten())


class StaticSlidingKVLayer(StaticKVLayer):
    """A sliding-window layer: a ring buffer of ``window`` positions, each stored twice.

    Keys/values are [B_max, H_kv, 2 * window, D]; only [.., window, D] when the window is at
    least max_cache_len (it cannot wrap then; :meth:`grow` switches layouts).

    Same mask sizes as transformers' ``StaticSlidingWindowLayer``, so its masks apply as they are;
    the window is ``min(sliding_window, max_cache_len)``.
    """

    is_sliding = True

    def __init__(self, max_batch_size, max_cache_len, sliding_window):
        super().__init__(max_batch_size, max_cache_len)
        self.sliding_window = sliding_window

    @property
    def window(self):
        return min(self.sliding_window, self.max_cache_len)

    @property
    def is_croppable(self):
        # As transformers' sliding layer: only a window that never wraps can be rolled back.
        return not self._doubled

    @property
    def _doubled(self):
        # A window of max_cache_len or more never wraps: a plain buffer of the window suffices.
        return self.sliding_window < self.max_cache_len

    def _slots(self):
        return 2 * self.window if self._doubled else self.window

    def _used_slots(self):
        return self._slots()

    def _write(self, start, key_states, value_states):
        """Store positions start .. start+n-1 (n <= window) at both of their ring slots."""
        b, n, w = key_states.shape[0], key_states.shape[-2], self.window
        s = start % w
        first = min(n, w - s)
        for off in ((0, w) if self._doubled else (0,)):
            self.keys[:b, :, off + s:off + s + first].copy_(key_states[:, :, :first])
            self.values[:b, :, off + s:off + s + first].copy_(value_states[:, :, :first])
            if first < n:
                self.keys[:b, :, off:off + n - first].copy_(key_states[:, :, first:])
                self.values[:b, :, off:off + n - first].copy_(value_states[:, :, first:])

    def _ordered(self, lo, hi, b):
        """Positions lo .. hi-1 (all still in the ring, hi - lo <= window) as contiguous views."""
        s = lo % self.window
        return self.keys[:b, :, s:s + hi - lo], self.values[:b, :, s:s + hi - lo]

    def update(self, key_states, value_states, *args, **kwargs):
        self.check_states(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, n, w = key_states.shape[0], key_states.shape[-2], self.window
        pos = self.cumulative_length
        self.cumulative_length = pos + n
        self.rows = b
        if pos + n <= w:
            # The ring has not wrapped: slot == position, the mask spans the whole window.
            self._write(pos, key_states, value_states)
            return self.keys[:b, :, :w], self.values[:b, :, :w]
        if n == 1:
            self._write(pos, key_states, value_states)
            return self._ordered(pos + 1 - w, pos + 1, b)
        # Several new positions past the window: attention needs the last w-1 old positions and
        # every new one (as transformers' static sliding layer does), then the ring keeps the
        # last w.
        lo = max(pos - w + 1, 0)
        old_k, old_v = self._ordered(lo, pos, b)
        full_k = torch.cat((old_k, key_states), dim=-2)
        full_v = torch.cat((old_v, value_states), dim=-2)
        self._write(pos + n - w, full_k[:, :, -w:], full_v[:, :, -w:])
        return full_k, full_v

    def get_mask_sizes(self, query_length):
        w, pos = self.window, self.cumulative_length
        offset = max(pos - w + 1, 0)
        if pos >= w:
            return w + query_length - 1, offset
        if pos + query_length > w:
            return pos + query_length, offset
        return w, offset

    def check_gather(self, index):
        super().check_gather(index)
        if self._doubled:
            # A ring slot is not a position: only a window that never wraps can be rearranged.
            raise ValueError(f"cannot rearrange positions of a sliding-window layer whose window "
                             f"({self.sliding_window}) is below max_cache_len "
                             f"({self.max_cache_len})")

    def check_crop(self, tokens_to_remove):
        super().check_crop(tokens_to_remove)
        # The next step needs the w-1 positions before the new end; once the ring has wrapped
        # it holds only the last w positions written, so at most one can be dropped.
        if tokens_to_remove < -1 and self.cumulative_length > self.window:
            raise ValueError(
                f"cannot remove {-tokens_to_remove} positions from a sliding-window layer holding "
                f"{self.cumulative_length}: its ring ({self.window}) no longer has the older ones")

    def grow(self, max_cache_len):
        old_slots = self._slots()
        self.max_cache_len = max_cache_len
        w = self.window
        if not self.is_initialized or self._slots() == old_slots:
            return
        # The layout changes only while max_cache_len bounded the window, so the ring has not
        # wrapped: positions 0..n-1 sit at slots 0..n-1 (and w..w+n-1 when doubled).
        n = self.cumulative_length
        copy = [((0, n), (0, n))] + ([((w, w + n), (0, n))] if self._doubled else [])
        self._resize(self._slots(), copy)


class StaticKVCache(Cache):
    """Preallocated per-layer key/value buffers written in place; a transformers ``Cache``.

    Parameters
    ----------
    config : transformers PretrainedConfig
        The model's config. Layer types are read as transformers' ``StaticCache`` reads them
        (``layer_types``, ``sliding_window``, ``use_sliding_window``,
        ``attention_chunk_size``): full-attention, sliding-window and chunked layers are
        supported (Llama, Llama4, Mistral, Qwen2, Gemma2/3, Cohere2, GPT-2, Falcon, Bloom,
        GPT-Neo local attention, ...). Other layer types (linear attention, KV sharing, ...)
        raise NotImplementedError naming the layer type and the model type.
    max_batch_size : int
        Largest batch the cache will hold; smaller batches use a leading view of the storage.
    max_cache_len : int
        Positions per row (prompt + generated tokens). Sliding layers keep only
        ``min(sliding_window, max_cache_len)`` of them. :meth:`grow` raises it later.
    dtype, device : optional
        When ``dtype`` is given the buffers are allocated now (on ``device``, default CPU), with
        the layout the model's attention writes; otherwise on the first forward, from the key
        states' dtype/device.
    exact_length : bool
        Full-attention layers return (and size masks for) only the positions written so far,
        as a ``DynamicCache`` does, instead of the whole static buffer (shapes then change
        every step). Attention over the longer, masked span is not bit-identical in every
        kernel (torch's CPU attention in bf16 / fp16: logits 1 ulp apart, other greedy and
        beam tokens); ``gpu_sampler.generate`` sets it there (``common.own_cache``).

    Full-attention layers hold ``keys`` / ``values`` of shape [max_batch_size, H_kv,
    max_cache_len, head_dim]; sliding layers [max_batch_size, H_kv, 2 * window, head_dim].
    Writing past ``max_cache_len``, a batch above ``max_batch_size``, or states on another
    device raise ValueError before any layer is written. ``reset()`` rewinds it for the next
    prompt; passing a filled cache with ``input_ids`` that extend it continues generation.

    Methods beyond transformers' ``Cache``: :meth:`check_capacity` (validate a whole
    generation up front), :meth:`attention_mask_length` (the 2-D mask length to pass),
    :meth:`grow` (enlarge in place between steps); ``reorder_cache``,
    ``batch_repeat_interleave`` and ``batch_select_indices`` gather rows in place into the
    same buffers (beam search).

    Example
    -------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from gpu_sampler.hf.cache import StaticKVCache
    >>> cfg = LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                   num_attention_heads=4, intermediate_size=64,
    ...                   eos_token_id=None)  # random weights: no early stop, a fixed shape
    >>> model = LlamaForCausalLM(cfg).eval()
    >>> cache = StaticKVCache(cfg, max_batch_size=2, max_cache_len=16)
    >>> from gpu_sampler.hf.compat import cache_arg  # "cache" from transformers 5.24 on
    >>> out = model.generate(torch.tensor([[5, 6, 7]]), **{cache_arg(model): cache},
    ...                      max_new_tokens=4, do_sample=False)
    >>> out.shape
    torch.Size([1, 7])
    >>> cache.reset()  # same storage, ready for the next prompt
    """

    # transformers <= 5.17 declares these two as read-only (deprecated) properties of Cache.
    # Plain class attributes shadow them, so the instance keeps its own values on every 5.x
    # (found on the first GPU run, which had transformers 5.17: the constructor raised).
    max_batch_size = None
    max_cache_len = None

    def __init__(self, config, max_batch_size, max_cache_len, dtype=None, device=None,
                 exact_length=False):
        for name, v in (("max_batch_size", max_batch_size), ("max_cache_len", max_cache_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        config = _text_config(config)
        num_layers = getattr(config, "num_hidden_layers", None)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"config.num_hidden_layers must be a positive int, got {num_layers!r}")
        layers = []
        for kind, window in _layer_plan(config):
            if kind == "sliding":
                layers.append(StaticSlidingKVLayer(max_batch_size, max_cache_len, window))
            else:
                layers.append(StaticKVLayer(max_batch_size, max_cache_len,
                                            exact_length=exact_length or kind == "exact"))
        super().__init__(layers=layers)
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        if dtype is not None:
            kv_heads, k_dim, v_dim = _kv_layout(config)
            for layer in self.layers:
                layer._allocate(kv_heads, k_dim, v_dim, dtype, device or "cpu")

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == 0:
            # Validate once for the whole forward so no layer is written when any would fail.
            if key_states.shape[-2] == 0:
                raise ValueError(self._reuse_message())
            self.check_write(key_states.shape[0], key_states.shape[-2])
            self.check_capacity(key_states.shape[0], 0, device=key_states.device)
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def to_dynamic(self, config, rows=None, length=None):
        """A DynamicCache holding copies of the first ``rows`` rows and ``length`` positions
        (default: the rows last written, every position written): what transformers returns
        where it ran on one. Sliding layers are not converted (ValueError)."""
        if any(self.is_sliding):
            raise ValueError("to_dynamic: a cache with sliding layers keeps a window, not every "
                             "position")
        rows = self.layers[0].rows if rows is None else rows
        length = self.get_seq_length() if length is None else length
        dynamic = DynamicCache(config=config)
        for idx, layer in enumerate(self.layers):
            if layer.is_initialized:
                dynamic.update(layer.keys[:rows, :, :length].clone(),
                               layer.values[:rows, :, :length].clone(), idx)
        return dynamic

    def crop(self, tokens_to_remove):
        """Drop the last ``-tokens_to_remove`` positions (transformers 5 semantics; 0 is a no-op).

        Raises ValueError, with nothing changed, for a positive count or a rollback a
        sliding-window ring cannot serve (more than one position once it has wrapped).
        """
        if isinstance(tokens_to_remove, torch.Tensor) and tokens_to_remove.numel() == 1 \
                and not tokens_to_remove.is_floating_point() \
                and tokens_to_remove.dtype != torch.bool:
            tokens_to_remove = int(tokens_to_remove)  # transformers 5.17's assisted decoding
        for layer in self.layers:
            layer.check_crop(tokens_to_remove)
        super().crop(tokens_to_remove)

    def _reuse_message(self, prompt_len=None):
        got = "" if prompt_len is None else f" and the new input has {prompt_len}"
        return (f"the cache already holds {self.get_seq_length()} positions{got}: to generate "
                f"from a fresh prompt call cache.reset() first (input_ids that extend the "
                f"cached sequence continue it)")

    def check_write(self, batch_size, n):
        """Raise ValueError now if a forward of `batch_size` rows x `n` new tokens cannot fit."""
        for layer in self.layers:
            layer.check_write(batch_size, n)

    def check_capacity(self, batch_size, total_len, device=None, input_len=None):
        """Raise ValueError unless a whole generation fits, before anything runs.

        Parameters
        ----------
        batch_size : int
            Rows of the generation (after num_return_sequences / num_beams expansion).
        total_len : int
            Positions the cache must hold per row: cached + fed tokens. A generation of
            ``max_length`` tokens feeds ``max_length - 1`` (the last token is never fed back).
            Sliding layers keep only their window, but the bound applies to every cache.
        device : torch.device or str, optional
            Where the model writes its key states; refused if the cache lives elsewhere.
        input_len : int, optional
            Length of the ``input_ids`` about to be fed. A cache already holding that many
            positions or more is a reuse without ``reset()`` and is refused.

        Example
        -------
        >>> from transformers import LlamaConfig
        >>> cache = StaticKVCache(LlamaConfig(num_hidden_layers=1), max_batch_size=2,
        ...                       max_cache_len=16)
        >>> cache.check_capacity(batch_size=2, total_len=16, device="cpu")  # fits: None
        >>> cache.check_capacity(batch_size=2, total_len=20)
        Traceback (most recent call last):
        ValueError: the generation needs 20 positions per row but the cache's max_cache_len=16: ...
        """
        if batch_size > self.max_batch_size:
            raise ValueError(f"batch size {batch_size} exceeds the cache's max_batch_size="
                             f"{self.max_batch_size}")
        if total_len > self.max_cache_len:
            raise ValueError(
                f"the generation needs {total_len} positions per row but the cache's max_cache_len="
                f"{self.max_cache_len}: create a larger cache or call cache.grow({total_len})")
        if device is not None:
            device = torch.device(device)
            for layer in self.layers:
                if layer.is_initialized and not _same_device(layer.device, device):
                    raise ValueError(f"the cache is on {layer.device} but the model runs on "
                                     f"{device}: create the cache on the model's device")
        if input_len is not None and 0 < input_len <= self.get_seq_length():
            raise ValueError(self._reuse_message(input_len))

    def attention_mask_length(self, query_length):
        """Length of the 2-D attention mask to pass with a forward of `query_length` new tokens.

        ``max_cache_len`` (a static shape; slots past the written ones are hidden by the causal
        mask, so they may hold 1), except for caches whose layers return exactly the positions
        seen (GPT-Neo local attention, Falcon ALiBi): cached positions + `query_length`. ALiBi
        models build their bias from this mask, so it must have the keys' length.

        Example
        -------
        >>> from transformers import LlamaConfig
        >>> cache = StaticKVCache(LlamaConfig(num_hidden_layers=1), max_batch_size=2,
        ...                       max_cache_len=16)
        >>> cache.attention_mask_length(3)  # Llama: the static length
        16
        """
        if any(getattr(layer, "exact_length", False) for layer in self.layers):
            return self.get_seq_length() + query_length
        return self.max_cache_len

    def gather_positions(self, index):
        """Rearrange each row's cached positions in place: afterwards position j of row b holds
        what position ``index[b, j]`` held (``index`` int64 [B, T], written positions only), and
        the cache holds T positions. Assisted decoding packs the positions rows keep this way
        (rows accept different numbers of draft tokens). ValueError, nothing changed, for an
        index outside the written positions or a sliding-window ring that has wrapped.
        """
        for layer in self.layers:
            layer.check_gather(index)
        for layer in self.layers:
            if layer.is_initialized:
                layer.gather_positions(index)
            else:
                layer.cumulative_length = index.shape[1]

    def gathered(self, index):
        """[(keys, values)] per layer: copies of the positions ``index`` names (see
        :meth:`gather_positions`); None for a layer not written yet."""
        for layer in self.layers:
            layer.check_gather(index)
        return [layer.gathered(index) if layer.is_initialized else None for layer in self.layers]

    def grow(self, max_cache_len):
        """Enlarge every full-attention layer to `max_cache_len` positions, in place.

        Cached positions are copied into new buffers of the same dtype/device; sliding layers
        keep their window (they only grow while ``max_cache_len`` bounded it). Call it between
        forward passes, e.g. doubling when a generation outgrows the cache. A compiled step that
        marked the old buffers static must re-mark the new ``layer.keys`` / ``layer.values``.

        Example
        -------
        >>> from transformers import LlamaConfig
        >>> cache = StaticKVCache(LlamaConfig(num_hidden_layers=1), max_batch_size=2,
        ...                       max_cache_len=16)
        >>> cache.grow(2 * cache.max_cache_len)
        >>> cache.max_cache_len
        32
        """
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int):
            raise ValueError(f"max_cache_len must be an int, got {max_cache_len!r}")
        if max_cache_len < self.max_cache_len:
            raise ValueError(f"max_cache_len={max_cache_len} is smaller than the current "
                             f"{self.max_cache_len}: grow() only enlarges the cache")
        for layer in self.layers:
            layer.grow(max_cache_len)
        self.max_cache_len = max_cache_len

    @property
    def batch_size(self):
        return self.max_batch_size


def _same_device(a, b):
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index
