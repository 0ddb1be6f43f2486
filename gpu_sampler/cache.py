"""A preallocated key/value cache that transformers models accept as ``past_key_values``.

Each layer owns one [max_batch_size, H_kv, max_cache_len, head_dim] buffer for keys and one for
values. New states are written with a slice copy at the current position, so decoding never
reallocates or concatenates; a smaller batch works on a leading view of the same storage.
"""
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["StaticKVCache"]

_FULL_ATTENTION = ("full_attention",)


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _check_attention_layers(config, max_cache_len):
    """Refuse configs whose attention is not plain causal over the whole sequence.

    A full cache with a sliding-window model is only exact when the window never binds, i.e.
    the window is at least max_cache_len; anything else is refused rather than silently wrong.
    """
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t not in _FULL_ATTENTION})
        if other:
            raise ValueError(
                f"StaticKVCache supports only full-attention layers, but config.layer_types contains "
                f"{other}; use transformers' own cache for this model.")
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    if window is not None and window < max_cache_len:
        raise ValueError(
            f"config.sliding_window={window} is smaller than max_cache_len={max_cache_len}: "
            f"StaticKVCache keeps every position and does not implement sliding-window "
            f"attention; use max_cache_len <= {window} or transformers' own cache.")
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk is not None:
        raise ValueError(f"config.attention_chunk_size={chunk}: chunked attention is not supported "
                         f"by StaticKVCache.")


class StaticKVLayer(CacheLayerMixin):
    """One layer of :class:`StaticKVCache` (keys/values [B_max, H_kv, max_cache_len, D])."""

    # Mask code keys off this flag: a compileable cache always gets an explicit mask for
    # single-token queries, which a cache with unwritten (future) slots needs to be correct.
    is_compileable = True
    is_sliding = False

    def __init__(self, max_batch_size, max_cache_len):
        super().__init__()
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        # Python int: positions are known on the host, so slicing needs no device sync.
        self.cumulative_length = 0

    def _allocate(self, num_heads, k_dim, v_dim, dtype, device):
        self.dtype, self.device = dtype, torch.device(device)
        self.num_heads = num_heads
        shape = (self.max_batch_size, num_heads, self.max_cache_len)
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
            raise ValueError(f"the cache needs {needed} positions ({self.cumulative_length} cached + "
                             f"{n} new) but max_cache_len={self.max_cache_len}")

    def update(self, key_states, value_states, *args, **kwargs):
        b, h, n, _ = key_states.shape
        self.check_write(b, n)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif (h != self.keys.shape[1] or key_states.shape[-1] != self.keys.shape[-1]
              or key_states.dtype != self.dtype):
            raise ValueError(
                f"key states {tuple(key_states.shape)} {key_states.dtype} do not match the cache "
                f"layout [B, {self.keys.shape[1]}, T, {self.keys.shape[-1]}] {self.dtype}")
        pos = self.cumulative_length
        # In-place slice write (dynamic_update_slice): no reallocation, no concatenation.
        self.keys[:b, :, pos:pos + n].copy_(key_states)
        self.values[:b, :, pos:pos + n].copy_(value_states)
        self.cumulative_length = pos + n
        return self.keys[:b], self.values[:b]

    def get_mask_sizes(self, query_length):
        # Attention always spans the whole buffer; the causal mask hides unwritten slots.
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

    def crop(self, max_length):
        if max_length < 0:
            max_length = self.cumulative_length + max_length
        self.cumulative_length = max(0, min(self.cumulative_length, max_length))

    def reorder_cache(self, beam_idx):
        # Beam search: gather rows along the batch back into the same buffers (no reallocation).
        if self.is_initialized and self.cumulative_length > 0:
            n, pos = beam_idx.shape[0], self.cumulative_length
            idx = beam_idx.to(device=self.keys.device, dtype=torch.long)
            self.keys[:n, :, :pos] = self.keys[:n, :, :pos].index_select(0, idx)
            self.values[:n, :, :pos] = self.values[:n, :, :pos].index_select(0, idx)

    def batch_repeat_interleave(self, repeats):
        raise NotImplementedError("StaticKVCache has a fixed batch; expand inputs before prefill")

    def batch_select_indices(self, indices):
        raise NotImplementedError("StaticKVCache has a fixed batch; batch_select_indices is not "
                                  "supported")


class StaticKVCache(Cache):
    """Preallocated per-layer key/value buffers written in place; a transformers ``Cache``.

    Parameters
    ----------
    config : transformers PretrainedConfig
        The model's config (num_hidden_layers, num_key_value_heads, head_dim are read from it).
        Configs with sliding-window / chunked / other non-full attention layers are refused
        with ValueError unless the window is at least ``max_cache_len``.
    max_batch_size : int
        Largest batch the cache will hold; smaller batches use a leading view of the storage.
    max_cache_len : int
        Positions per row (prompt + generated tokens).
    dtype, device : optional
        When ``dtype`` is given the buffers are allocated now (on ``device``, default CPU);
        otherwise on the first forward, from the key states' dtype/device.

    Each layer holds ``keys`` / ``values`` of shape [max_batch_size, H_kv, max_cache_len,
    head_dim]. Writing past ``max_cache_len`` or a batch above ``max_batch_size`` raises
    ValueError before anything is written. ``reset()`` rewinds it for the next prompt.

    Example
    -------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from gpu_sampler.cache import StaticKVCache
    >>> cfg = LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                   num_attention_heads=4, intermediate_size=64)
    >>> model = LlamaForCausalLM(cfg).eval()
    >>> cache = StaticKVCache(cfg, max_batch_size=2, max_cache_len=16)
    >>> out = model.generate(torch.tensor([[5, 6, 7]]), past_key_values=cache,
    ...                      max_new_tokens=4, do_sample=False)
    >>> out.shape
    torch.Size([1, 7])
    >>> cache.reset()  # same storage, ready for the next prompt
    """

    def __init__(self, config, max_batch_size, max_cache_len, dtype=None, device=None):
        for name, v in (("max_batch_size", max_batch_size), ("max_cache_len", max_cache_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        config = _text_config(config)
        _check_attention_layers(config, max_cache_len)
        num_layers = getattr(config, "num_hidden_layers", None)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"config.num_hidden_layers must be a positive int, got {num_layers!r}")
        super().__init__(layers=[StaticKVLayer(max_batch_size, max_cache_len)
                                 for _ in range(num_layers)])
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        if dtype is not None:
            heads = getattr(config, "num_attention_heads")
            kv_heads = getattr(config, "num_key_value_heads", None) or heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
            for layer in self.layers:
                layer._allocate(kv_heads, head_dim, head_dim, dtype, device or "cpu")

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == 0:
            # Validate once for the whole forward so no layer is written when any would fail.
            self.layers[0].check_write(key_states.shape[0], key_states.shape[-2])
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def check_write(self, batch_size, n):
        """Raise ValueError now if a forward of `batch_size` rows x `n` new tokens cannot fit."""
        self.layers[0].check_write(batch_size, n)

    @property
    def batch_size(self):
        return self.max_batch_size
