"""A persistent sampler for serving loops: per-request parameter slots and output buffers.

A serving stack keeps one slot per running request. ``SamplingSlots`` holds the seven sampling
parameters, the seed and the position (offset) of every slot as device tensors allocated once;
``set_row`` changes one slot in place when a request joins. ``Sampler`` owns the output
buffers; a call samples rows 0 .. B-1 of the logits with slots 0 .. B-1, writes the tokens
(and logprobs) into its buffers, and advances those slots' offsets by one, all on the device:
with check=False (the default here) nothing synchronises with the host.

A row's token depends only on its logits, its slot's parameters, seed and offset, so a request
gets the same tokens whatever the other rows of the batch are.

This release still lets ``sample()`` allocate its kernel workspace per call; the slots and the
outputs are what stays put.
"""
import torch

from . import params
from .sampler import sample

__all__ = ["SamplingSlots", "Sampler"]

_DEFAULTS = params.SamplingParams()


class SamplingSlots:
    """Per-slot sampling parameters, seeds and offsets, as [max_batch] device tensors.

    Example:
        >>> slots = SamplingSlots(8)
        >>> slots.set_row(2, temperature=0.7, top_p=0.9, seed=1234, offset=0)
        >>> float(slots.temperature[2])
        0.699999988079071
    """

    def __init__(self, max_batch, device="cpu"):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        self.max_batch = max_batch
        self.device = torch.device(device)
        for name in params.SAMPLING_NAMES:
            dtype = torch.int64 if name == "top_k" else torch.float32
            setattr(self, name, torch.full((max_batch,), getattr(_DEFAULTS, name), dtype=dtype,
                                           device=self.device))
        self.seed = torch.zeros(max_batch, dtype=torch.int64, device=self.device)
        self.offset = torch.zeros(max_batch, dtype=torch.int64, device=self.device)

    def set_row(self, i, *, seed=None, offset=0, **values):
        """Reset slot ``i`` for a new request: its parameters (others back to the defaults),
        its seed (default: drawn from torch's generator) and its first offset. In place."""
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.max_batch:
            raise ValueError(f"slot index must be an int in [0, {self.max_batch}), got {i!r}")
        unknown = set(values) - set(params.SAMPLING_NAMES)
        if unknown:
            raise ValueError(f"set_row got unknown parameters {sorted(unknown)}")
        # everything validated before the first write: a refused request leaves the slot as
        # it was (not half the new request's values over the old one's)
        new = {name: params.normalise_param(name, values.get(name, getattr(_DEFAULTS, name)),
                                            1, 2 ** 62, self.device, True)
               for name in params.SAMPLING_NAMES}
        offset = params.int64_seed(offset, "offset")
        if seed is None:
            # torch's CPU generator, whatever the default device (a CUDA one would sync here)
            seed = int(torch.randint(0, 2 ** 63 - 1, (1,), device="cpu"))
        seed = params.int64_seed(seed)
        for name, v in new.items():
            getattr(self, name)[i] = v
        self.seed[i] = seed
        self.offset[i] = offset

    def rows(self, B):
        """The first B slots as sample()'s keyword arguments (views, no copies)."""
        kw = {name: getattr(self, name)[:B] for name in params.SAMPLING_NAMES}
        return dict(kw, seed=self.seed[:B], offset=self.offset[:B])


class Sampler:
    """``sample()`` over slots, writing into buffers allocated once.

    Args:
        max_batch: the most rows a call samples. vocab: V. device: the logits' device.
        dtype: the logits' dtype (checked on each call).

    Example:
        >>> slots, sampler = SamplingSlots(4), Sampler(4, 100)
        >>> for i in range(4):
        ...     slots.set_row(i, temperature=0.8, seed=i)
        >>> tokens = sampler(torch.randn(3, 100), slots)     # rows 0..2 use slots 0..2
        >>> tokens.shape, int(slots.offset[0])
        (torch.Size([3]), 1)
    """

    def __init__(self, max_batch, vocab, device="cpu", dtype=torch.float32):
        for name, v in (("max_batch", max_batch), ("vocab", vocab)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if dtype not in params.FLOAT_DTYPES:
            raise ValueError(f"dtype must be one of {params.FLOAT_DTYPES} (the logits' dtype), "
                             f"got {dtype!r}")
        self.max_batch, self.vocab = max_batch, vocab
        self.device, self.dtype = torch.device(device), dtype
        self.tokens = torch.empty(max_batch, dtype=torch.int64, device=self.device)
        self.logprobs = torch.empty(max_batch, dtype=torch.float32, device=self.device)

    def __call__(self, logits, slots, *, input_ids=None, prompt_lens=None,
                 return_logprobs=False, check=False, backend="auto", **request_kw):
        """Sample rows 0 .. B-1 of ``logits`` [B, V] with slots 0 .. B-1; returns views of the
        token (and logprob) buffers, and advances the slots' offsets by one.

        ``request_kw`` passes sample()'s per-call extras through (allowed_mask, logit_bias,
        top_logprobs, ...); with top_logprobs the result is sample()'s SampleOutput."""
        B = logits.shape[0]
        if logits.dim() != 2 or not 0 < B <= self.max_batch or logits.shape[1] != self.vocab \
                or logits.dtype != self.dtype or logits.device != self.device:
            raise ValueError(f"logits must be [B <= {self.max_batch}, {self.vocab}] "
                             f"{self.dtype} on {self.device}, got {tuple(logits.shape)} "
                             f"{logits.dtype} on {logits.device}")
        if B > slots.max_batch:
            raise ValueError(f"slots hold {slots.max_batch} rows, the logits have {B}")
        clash = sorted(set(request_kw) & {*params.SAMPLING_NAMES, "seed", "offset", "generator"})
        if clash:
            raise ValueError(f"{', '.join(clash)}: per-request values live in the slots "
                             "(SamplingSlots.set_row), not in the call")
        out = sample(logits, input_ids=input_ids, prompt_lens=prompt_lens, check=check,
                     backend=backend, return_logprobs=True, **slots.rows(B), **request_kw)
        tok, logp = out[0], out[1]
        self.tokens[:B].copy_(tok)
        self.logprobs[:B].copy_(logp)
        slots.offset[:B] += 1
        if len(out) > 2:
            return type(out)(self.tokens[:B], self.logprobs[:B], *out[2:])
        return (self.tokens[:B], self.logprobs[:B]) if return_logprobs else self.tokens[:B]
