"""Public sampling API: validation, normalisation and backend dispatch.

Layers: kernels/sampling.py (Triton kernel + launcher) and reference.py (torch twin) share one
set of rules; this module validates once and hands both the same normalised parameters:
a Python number for every row, or a contiguous (B,) tensor (float32, or int64 for integer ones).
"""
import math
import numbers
import os
import struct

import torch

from . import reference

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BACKENDS = ("auto", "torch", "triton")
_U64 = 1 << 64


def triton_available():
    """True when triton imports (it may still have no GPU driver to run on)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _fmt(v):
    return repr(v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)


def _f32(v):
    """A Python float rounded to float32 (still a Python float); +-inf past float32's range."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def int64_seed(value, name="seed"):
    """A Python int seed / offset in [-2**63, 2**64) as the int64 with the same 64 bits, so s
    and s - 2**64 name the same stream; ValueError naming ``name`` otherwise."""
    if type(value) is not int and (isinstance(value, bool)
                                   or not isinstance(value, numbers.Integral)):
        raise ValueError(f"{name} must be an int or an int64 tensor, got {value!r}")
    value = int(value)
    if not -(_U64 >> 1) <= value < _U64:
        raise ValueError(f"{name}={value} is outside [-2**63, 2**64): seeds and offsets are "
                         "64-bit")
    return value - _U64 if value >= _U64 >> 1 else value


def _scalar(name, value, B, V, check_scalar):
    """A Python-number parameter normalised by the numeric policy (docs/reliability.md)."""
    kind = _RULES[name][0]
    t = type(value)  # the common float / int skip the slower ABC checks (per-token path)
    if t is not float and t is not int and (isinstance(value, bool)
                                            or not isinstance(value, numbers.Real)):
        raise ValueError(f"{name} must be a number or a 1-D tensor of length B={B}, "
                         f"got {value!r}")
    if kind == "seed":
        if t is not int and not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return int64_seed(value, name)
    if kind == "int":
        if t is not int and not isinstance(value, numbers.Integral):
            f = float(value)
            if not f.is_integer():
                raise ValueError(f"{name} must be an integer, got {value!r}")
        value = int(value)
        if check_scalar(value):
            raise ValueError(f"{name} has an invalid value {value!r}")
        return min(value, V) if name == "top_k" else value  # >= V keeps all
    try:
        f = float(value)
        finite = math.isfinite(f)
    except OverflowError:  # an int beyond float64: a number, but not one float32 holds
        f, finite = (math.inf if value > 0 else -math.inf), True
    v = _f32(f)  # both backends compute in float32: they must see the same number
    if check_scalar(v) or (v == 0 and f > 0 and name in _POSITIVE):
        if finite and not math.isfinite(v):
            raise ValueError(f"{name}={value!r} is not finite in float32 (the sampler's math is "
                             "float32; |value| must be < 3.4e38)")
        if f > 0 and v == 0:
            raise ValueError(f"{name}={value!r} rounds to 0 in float32 (the sampler's math is "
                             "float32; the smallest positive value is 1.4e-45)")
        raise ValueError(f"{name} has an invalid value {value!r}")
    return v


def _param(name, value, B, V, device, check):
    """Normalise one parameter: a Python number (float32-exact for float parameters) or a
    contiguous (B,) tensor (float32, or int64 for integer ones)."""
    kind, bad_if, check_scalar = _RULES[name]
    if not isinstance(value, torch.Tensor):
        return _scalar(name, value, B, V, check_scalar)
    if value.dim() != 1 or value.shape[0] != B:
        raise ValueError(f"{name} must be a number or a 1-D tensor of length B={B}, "
                         f"got a tensor of shape {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} must be on the logits' device {device}, got {value.device}")
    given = value
    if kind != "float":
        if value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex():
            raise ValueError(f"{name} must be an integer tensor, got dtype {value.dtype}")
        value = value.to(torch.int64).contiguous()  # uint64 seeds keep their 64 bits
        if name == "top_k":
            value = value.clamp(max=V)
    else:
        if not value.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
        value = value.to(torch.float32).contiguous()
        if given.dtype == torch.float64 and name in _POSITIVE:
            # Positive but 0 in float32 is refused like the scalar: NaN makes the row invalid.
            value = torch.where((given > 0) & (value == 0), float("nan"), value)
    if check:
        bad = bad_if(value)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"{name} has an invalid value {given[i].item()!r} at row {i} "
                             "(in float32, the sampler's math)")
    return value


def _not_in_unit(v):
    return ~((v >= 0) & (v <= 1))


_POSITIVE = ("temperature", "repetition_penalty")  # a positive value must stay positive in fp32
_INF = math.inf
_RULES = {
    # name: (kind, bad values of a float32/int64 tensor, the same for a normalised number)
    "temperature": ("float", lambda v: ~((v >= 0) & (v < _INF)),
                    lambda v: not (0 <= v < _INF)),
    "top_k": ("int", lambda v: v < 0, lambda v: v < 0),
    "top_p": ("float", _not_in_unit, lambda v: not 0 <= v <= 1),
    "min_p": ("float", _not_in_unit, lambda v: not 0 <= v <= 1),
    "repetition_penalty": ("float", lambda v: ~((v > 0) & (v < _INF)),
                           lambda v: not 0 < v < _INF),
    "presence_penalty": ("float", lambda v: ~v.isfinite(), lambda v: not math.isfinite(v)),
    "frequency_penalty": ("float", lambda v: ~v.isfinite(), lambda v: not math.isfinite(v)),
    "prompt_lens": ("int", lambda v: v < 0, lambda v: v < 0),
    # contrastive decoding (gpu_sampler/contrastive.py)
    "cd_alpha": ("float", _not_in_unit, lambda v: not 0 <= v <= 1),
    "cd_beta": ("float", lambda v: ~((v >= 0) & (v < _INF)), lambda v: not 0 <= v < _INF),
    "seed": ("seed", None, None),
    "offset": ("seed", None, None),
}


def _check_generator(generator, device):
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {generator!r}")
    gd = generator.device
    if gd.type != device.type or (gd.index is not None and device.index is not None
                                  and gd.index != device.index):
        raise ValueError(f"generator is on {gd}; it must be on the logits' device {device}")


def _normalise(logits, params, input_ids, prompt_lens, generator, seed, offset, check, backend):
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    if logits.dtype == torch.float64:
        raise ValueError("logits must be float32/float16/bfloat16, got float64: the sampler's "
                         "math is float32, convert with logits.float()")
    if logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"logits must be floating point (float32/float16/bfloat16), "
                         f"got dtype {logits.dtype}")
    B, V = logits.shape
    if V == 0:
        raise ValueError("logits has V=0 columns: the vocabulary must have at least one token")
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    dev = logits.device
    out = {}
    for name, value in params.items():
        out[name] = _param(name, value, B, V, dev, check)

    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a 2-D [B, L] integer tensor, got "
                             f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
        if input_ids.shape[0] != B:
            raise ValueError(f"input_ids must have B={B} rows, got shape {tuple(input_ids.shape)}")
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
        if input_ids.device != dev:
            raise ValueError(f"input_ids must be on the logits' device {dev}, got {input_ids.device}")
        if check and input_ids.numel() > 0:
            mx = int(input_ids.max())
            if mx >= V:
                raise ValueError(f"input_ids contains id {mx}, which is >= the vocabulary size V={V}")
    if prompt_lens is not None:
        prompt_lens = _param("prompt_lens", prompt_lens, B, V, dev, check)
    _check_generator(generator, dev)
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if offset is not None and seed is None:
        raise ValueError(f"offset={_fmt(offset)} needs seed: offsets index a seeded stream")
    if seed is not None:
        seed = _param("seed", seed, B, V, dev, False)
        offset = _param("offset", 0 if offset is None else offset, B, V, dev, False)
    return out, input_ids, prompt_lens, seed, offset


def _pick_backend(backend, logits):
    if backend == "torch":
        return "torch"
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package, which does not import")
        if not logits.is_cuda and not interp:
            raise ValueError(f"backend='triton' needs CUDA tensors (logits are on {logits.device});"
                             " set TRITON_INTERPRET=1 before importing gpu_sampler to run the "
                             "kernel on CPU tensors")
        return "triton"
    return "triton" if logits.is_cuda and triton_available() else "torch"


def _draw_seeds(B, device, generator, needed):
    """Per-row 63-bit seeds from the generator: one tiny launch, CUDA-graph safe, no sync."""
    if not needed:
        return 0
    return torch.randint(0, 2 ** 63 - 1, (B,), device=device, dtype=torch.int64,
                         generator=generator)


def _needs_random(temperature):
    if isinstance(temperature, torch.Tensor):
        return True
    return temperature != 0.0


def _raise_invalid(logits, bad_rows, what):
    r = int(bad_rows.nonzero()[0, 0])
    if bool(logits[r].isnan().any()):
        raise ValueError(f"logits row {r} contains NaN")
    raise ValueError(f"logits row {r} has no finite logit left to {what} (all -inf after "
                     "penalties, or an invalid per-row parameter)")


def _raise_bad(logits, cd, bad_rows, what):
    """Raise for the first invalid row; with contrastive decoding the message is about its
    scores, the same on both backends."""
    if cd is None:
        _raise_invalid(logits, bad_rows, what)
    from . import contrastive
    contrastive.raise_invalid_row(logits, cd, bad_rows, what)


def _cd_kwargs(cd):
    if cd is None:
        return {}
    return dict(amateur_logits=cd[0], cd_alpha=cd[1], cd_beta=cd[2])


@torch.no_grad()  # sampling has no gradient; skipping autograd bookkeeping is ~20% at B=1
def sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
           presence_penalty=0.0, frequency_penalty=0.0, input_ids=None, prompt_lens=None,
           generator=None, seed=None, offset=None, return_logprobs=False, check=True,
           backend="auto", amateur_logits=None, cd_alpha=0.1, cd_beta=0.5):
    """Draw one token per row after penalties, temperature, top-k, top-p and min-p.

    Args:
        logits: [B, V] float32 / float16 / bfloat16 (math is float32; float64 is refused),
            V >= 1.
        temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty: a Python number for every row, or a 1-D tensor of length B on the
            logits' device. temperature 0 = greedy for that row (argmax, lowest index on ties);
            top_k 0 or >= V, top_p 1.0, min_p 0.0 = off. Applied in transformers' order:
            repetition -> presence/frequency -> temperature -> top-k -> top-p -> min-p.
            Float values are rounded to float32 first; one float32 cannot hold (not finite,
            or a positive temperature / repetition_penalty that rounds to 0) is refused.
            Extreme values: docs/reliability.md.
        input_ids: [B, L] integer history for the penalties; negative ids are padding.
        prompt_lens: int or LongTensor [B]; presence/frequency count only positions >= it.
        generator: torch.Generator on the logits' device for the draw (default: the device's
            default generator).
        seed, offset: int in [-2**63, 2**64) or LongTensor [B] each; a row's token then depends
            only on its logits, parameters, seed and offset (e.g. offset = position). Ints are
            64-bit: s and s - 2**64 are the same stream.
        return_logprobs: also return the float32 log-probability of each drawn token under
            the distribution it was drawn from (``sampling_distribution``).
        check: validate tensor parameter values and raise ValueError for NaN rows or rows with
            nothing left to sample (may synchronise). With check=False nothing synchronises
            and such rows, and rows with an invalid per-row value (NaN, +-inf, ...), yield
            token -1 (logprob -inf).
        backend: "auto" (Triton kernel on CUDA, torch twin otherwise), "triton" or "torch".
        amateur_logits, cd_alpha, cd_beta: contrastive decoding (gpu_sampler/contrastive.py):
            with amateur_logits [B, V] (same shape and device) the row samples from the scores
            (1 + cd_beta) * logits - cd_beta * amateur_logits on the tokens with
            p >= cd_alpha * max p (others -inf); everything above then applies to the scores.
            cd_alpha in [0, 1], cd_beta >= 0: numbers or float tensors [B]. The Triton backend
            computes the scores inside its own launches (one extra read of amateur_logits).

    Returns:
        LongTensor [B], or (tokens [B], logprobs float32 [B]) with return_logprobs.

    Example:
        >>> import torch, gpu_sampler
        >>> logits = torch.randn(4, 1000)
        >>> tok = gpu_sampler.sample(logits, temperature=torch.tensor([0.0, 0.7, 1.0, 0.7]),
        ...                          top_k=50, top_p=0.9, seed=1234, offset=7)
        >>> tok.shape
        torch.Size([4])
    """
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    params, input_ids, prompt_lens, seed, offset = _normalise(
        logits, params, input_ids, prompt_lens, generator, seed, offset, check, backend)
    from . import contrastive  # imports this module
    cd = contrastive.contrastive_args(logits, amateur_logits, cd_alpha, cd_beta, check)
    B = logits.shape[0]
    if seed is None:
        seed = _draw_seeds(B, logits.device, generator, _needs_random(params["temperature"]))
        offset = 0
    which = _pick_backend(backend, logits)
    if B == 0:
        tok = torch.empty(0, dtype=torch.int64, device=logits.device)
        logp = torch.empty(0, dtype=torch.float32, device=logits.device)
    elif which == "triton":
        from . import kernels
        tok, logp = kernels.fused_sample(logits, input_ids=input_ids, prompt_lens=prompt_lens,
                                         seed=seed, offset=offset, **_cd_kwargs(cd), **params)
    else:
        rows = logits if cd is None else contrastive.scores_reference(logits, cd, check)
        tok, logp = reference.sample_reference(rows, input_ids=input_ids,
                                               prompt_lens=prompt_lens, seed=seed,
                                               offset=offset, **params)
    if check and B > 0:
        bad = tok < 0
        if bool(bad.any()):
            _raise_bad(logits, cd, bad, "sample")
    return (tok, logp) if return_logprobs else tok


@torch.no_grad()
def sampling_distribution(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                          repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                          input_ids=None, prompt_lens=None, check=True, backend="auto",
                          amateur_logits=None, cd_alpha=0.1, cd_beta=0.5):
    """The exact distribution ``sample`` draws from, as float32 [B, V].

    Takes the same filtering / penalty parameters as ``sample`` (see there). Filtered tokens are
    0; rows with temperature 0 are one-hot at the argmax. Invalid rows (NaN, nothing left) raise
    ValueError with check=True, and are all zeros with check=False.

    Example:
        >>> import torch, gpu_sampler
        >>> p = gpu_sampler.sampling_distribution(torch.tensor([[2.0, 1.0, 1.0, -1.0]]), top_k=2)
        >>> p[0, 3].item()
        0.0
    """
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty)
    params, input_ids, prompt_lens, _, _ = _normalise(
        logits, params, input_ids, prompt_lens, None, None, None, check, backend)
    from . import contrastive  # imports this module
    cd = contrastive.contrastive_args(logits, amateur_logits, cd_alpha, cd_beta, check)
    if logits.shape[0] == 0:
        return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if _pick_backend(backend, logits) == "triton":
        from . import kernels
        probs = kernels.fused_sample(logits, input_ids=input_ids, prompt_lens=prompt_lens,
                                     write_probs=True, **_cd_kwargs(cd), **params)
    else:
        rows = logits if cd is None else contrastive.scores_reference(logits, cd, check)
        probs = reference.sampling_distribution_reference(
            rows, input_ids=input_ids, prompt_lens=prompt_lens, **params)
    if check:
        bad = ~(probs.sum(1) > 0)
        if bool(bad.any()):
            _raise_bad(logits, cd, bad, "sample from")
    return probs
