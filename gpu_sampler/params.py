"""Sampling parameters: the one place their rules live (a leaf module: it imports torch only).

Every layer (``sample()``, the torch twin, contrastive scores, vocab-parallel sampling, beam
steps, generate()) takes its rules from here:

- ``RULES``: per parameter, its kind and the values that make a row invalid, for a float32 /
  int64 tensor and for a Python number (numeric policy: docs/reliability.md);
- ``normalise_param`` / ``normalise``: a Python number (float32-exact for float parameters) or a
  contiguous (B,) tensor (float32, or int64 for integer ones), ValueError naming the parameter;
- ``SamplingParams``: the seven normalised sampling parameters, passed between layers as one;
- seeds (``int64_seed``, ``row_seeds``, ``draw_seeds``), the backend choice, the contrastive
  defaults and the invalid-row errors.
"""
import dataclasses
import math
import numbers
import os
import struct
from typing import NamedTuple, Optional, Union

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("auto", "torch", "triton")
CD_ALPHA = 0.1  # contrastive decoding: plausibility cut-off
CD_BETA = 0.5   # contrastive decoding: amateur weight
_U64 = 1 << 64
_INF = math.inf
POSITIVE = ("temperature", "repetition_penalty")  # a positive value must stay positive in fp32


class Rule(NamedTuple):
    kind: str        # "float", "int" or "seed"
    bad: object      # float32 / int64 tensor -> bool tensor of invalid values
    bad_scalar: object  # normalised Python number -> bool


def _not_in_unit(v):
    return ~((v >= 0) & (v <= 1))


RULES = {
    "temperature": Rule("float", lambda v: ~((v >= 0) & (v < _INF)),
                        lambda v: not (0 <= v < _INF)),
    "top_k": Rule("int", lambda v: v < 0, lambda v: v < 0),
    "top_p": Rule("float", _not_in_unit, lambda v: not 0 <= v <= 1),
    "min_p": Rule("float", _not_in_unit, lambda v: not 0 <= v <= 1),
    "repetition_penalty": Rule("float", lambda v: ~((v > 0) & (v < _INF)),
                               lambda v: not 0 < v < _INF),
    "presence_penalty": Rule("float", lambda v: ~v.isfinite(), lambda v: not math.isfinite(v)),
    "frequency_penalty": Rule("float", lambda v: ~v.isfinite(), lambda v: not math.isfinite(v)),
    "prompt_lens": Rule("int", lambda v: v < 0, lambda v: v < 0),
    "cd_alpha": Rule("float", _not_in_unit, lambda v: not 0 <= v <= 1),
    "cd_beta": Rule("float", lambda v: ~((v >= 0) & (v < _INF)), lambda v: not 0 <= v < _INF),
    "seed": Rule("seed", None, None),
    "offset": Rule("seed", None, None),
}

Param = Union[float, int, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """The seven sampling parameters, normalised: each a Python number or a (B,) tensor."""
    temperature: Param = 1.0
    top_k: Param = 0
    top_p: Param = 1.0
    min_p: Param = 0.0
    repetition_penalty: Param = 1.0
    presence_penalty: Param = 0.0
    frequency_penalty: Param = 0.0

    def as_kwargs(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def has_repetition(self):
        return isinstance(self.repetition_penalty, torch.Tensor) or self.repetition_penalty != 1.0

    def has_presence_frequency(self):
        return any(isinstance(v, torch.Tensor) or v != 0.0
                   for v in (self.presence_penalty, self.frequency_penalty))

    def bad_rows(self, names=None):
        """Rows with an invalid per-row value (bool [B]), or None when every parameter named
        (default: all) is a validated Python number."""
        bad = None
        for name in names or SAMPLING_NAMES:
            v = getattr(self, name)
            if isinstance(v, torch.Tensor):
                b = RULES[name].bad(v)
                bad = b if bad is None else bad | b
        return bad


SAMPLING_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))


class Normalised(NamedTuple):
    """What ``normalise`` returns: parameters, history and the RNG stream of one call."""
    params: SamplingParams
    input_ids: Optional[torch.Tensor]
    prompt_lens: Optional[Param]
    seed: Optional[Param]
    offset: Optional[Param]


def fmt(v):
    return repr(v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)


def f32(v):
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


def row_seeds(seed, B, device):
    """One int64 seed per row: a tensor [B] as given, or an int as ``seed + row`` (64 bits,
    wrapping), so copies of a prompt (num_return_sequences, beams) get distinct streams."""
    if isinstance(seed, torch.Tensor):
        if seed.dim() != 1 or seed.shape[0] != B or seed.dtype.is_floating_point:
            raise ValueError(f"seed must be an int or an integer tensor of shape [{B}] (one per "
                             f"output row), got shape {tuple(seed.shape)} {seed.dtype}")
        return seed.to(device=device, dtype=torch.int64)
    base = int64_seed(seed)
    return torch.tensor([int64_seed((base + i) % _U64) for i in range(B)], device=device,
                        dtype=torch.int64)


def draw_seeds(B, device, generator, needed):
    """Per-row 63-bit seeds from the generator: one tiny launch, CUDA-graph safe, no sync."""
    if not needed:
        return 0
    # no generator= keyword when there is none: torch.compile's fake randint.generator
    # overload refuses a symbolic size (a dynamic batch)
    gen = {} if generator is None else dict(generator=generator)
    return torch.randint(0, 2 ** 63 - 1, (B,), device=device, dtype=torch.int64, **gen)


def per_row(v, B, dtype, device):
    """``v`` as a [B] tensor of ``dtype`` (a number broadcast): how the torch ops take it."""
    if isinstance(v, torch.Tensor):
        return v.to(device=device, dtype=dtype)
    return torch.full((B,), v, dtype=dtype, device=device)


def _op_number(name, v):
    """A Python-number parameter as ``op_params`` broadcasts it (traced: no value checks, so
    no guard on the value; the op's eager body applies check=False semantics). What eager
    refuses whatever ``check`` is (a bool, a non-number, a fractional integer parameter) is
    refused here too; seeds / offsets in [2**63, 2**64) become the int64 with the same bits,
    integer parameters past int64 are clamped (top_k >= V keeps all)."""
    kind = RULES[name].kind
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        return v
    if kind == "seed":
        return int64_seed(v, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _scalar(name, v, 1, 1)  # raises the eager ValueError
    if kind == "float":
        return v
    if isinstance(v, float):
        if not v.is_integer():
            _scalar(name, v, 1, 1)  # raises the eager ValueError
        v = int(v)  # an integral float is taken, as in eager
    return max(-1, min(v, (_U64 >> 1) - 1))


def op_params(values, prompt_lens, seed, offset, B, device):
    """(values, prompt_lens, seed, offset) as the custom ops take them under torch.compile:
    every parameter a [B] tensor (int64 for top_k, prompt_lens, seed and offset); no seed
    draws per-row seeds from torch's default generator. Float numbers become float64 rows
    and tensors keep their dtype, so the op's eager body rounds and checks them as
    ``sample()`` does (a positive temperature that rounds to 0 makes the row invalid, an
    integer temperature tensor is refused)."""
    if offset is not None and seed is None:
        raise ValueError(f"offset={fmt(offset)} needs seed: offsets index a seeded stream")

    def row(name, v, dtype):
        if isinstance(v, torch.Tensor):  # as given: the op body checks and converts it
            return v.to(device=device)
        return per_row(_op_number(name, v), B, dtype, device)

    rows = {k: row(k, v, torch.float64 if RULES[k].kind == "float" else torch.int64)
            for k, v in values.items()}
    if seed is None:
        seed, offset = draw_seeds(B, device, None, True), 0
    offset = 0 if offset is None else offset
    if prompt_lens is not None:
        prompt_lens = row("prompt_lens", prompt_lens, torch.int64)
    return (rows, prompt_lens, row("seed", seed, torch.int64), row("offset", offset, torch.int64))


def needs_random(temperature):
    """Whether a draw needs random bits: every row greedy (a number 0) needs none."""
    return isinstance(temperature, torch.Tensor) or temperature != 0.0


def _scalar_float(name, value, check_scalar):
    try:
        f = float(value)
        finite = math.isfinite(f)
    except OverflowError:  # an int beyond float64: a number, but not one float32 holds
        f, finite = (math.inf if value > 0 else -math.inf), True
    v = f32(f)  # both backends compute in float32: they must see the same number
    if check_scalar(v) or (v == 0 and f > 0 and name in POSITIVE):
        if finite and not math.isfinite(v):
            raise ValueError(f"{name}={value!r} is not finite in float32 (the sampler's math is "
                             "float32; |value| must be < 3.4e38)")
        if f > 0 and v == 0:
            raise ValueError(f"{name}={value!r} rounds to 0 in float32 (the sampler's math is "
                             "float32; the smallest positive value is 1.4e-45)")
        raise ValueError(f"{name} has an invalid value {value!r}")
    return v


def _scalar(name, value, B, V):
    """A Python-number parameter normalised by the numeric policy (docs/reliability.md)."""
    kind, _, check_scalar = RULES[name]
    t = type(value)  # the common float / int skip the slower ABC checks (per-token path)
    if t is not float and t is not int and (isinstance(value, bool)
                                            or not isinstance(value, numbers.Real)):
        raise ValueError(f"{name} must be a number or a 1-D tensor of length B={B}, "
                         f"got {value!r}")
    if kind == "float":
        return _scalar_float(name, value, check_scalar)
    if t is not int and not isinstance(value, numbers.Integral):
        if kind == "seed" or not float(value).is_integer():
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if kind == "seed":
        return int64_seed(value, name)
    value = int(value)
    if check_scalar(value):
        raise ValueError(f"{name} has an invalid value {value!r}")
    return min(value, V) if name == "top_k" else value  # >= V keeps all


def _tensor(name, value, B, V, device, check):
    if value.dim() != 1 or value.shape[0] != B:
        raise ValueError(f"{name} must be a number or a 1-D tensor of length B={B}, "
                         f"got a tensor of shape {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} must be on the logits' device {device}, got {value.device}")
    kind, bad_if, _ = RULES[name]
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
        if given.dtype == torch.float64 and name in POSITIVE:
            # Positive but 0 in float32 is refused like the scalar: NaN makes the row invalid.
            value = torch.where((given > 0) & (value == 0), float("nan"), value)
    if check and bad_if is not None:
        bad = bad_if(value)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"{name} has an invalid value {given[i].item()!r} at row {i} "
                             "(in float32, the sampler's math)")
    return value


def accepts(name, value):
    """Whether the Python number ``value`` passes ``name``'s numeric policy (``sample()`` takes
    it): callers that may hand a value elsewhere (generate() leaves transformers' own
    processor in torch for a repetition_penalty of inf) ask here instead of catching."""
    try:
        _scalar(name, value, 1, 1)
    except ValueError:
        return False
    return True


def normalise_param(name, value, B, V, device, check):
    """One parameter: a Python number (float32-exact for float parameters) or a contiguous
    (B,) tensor (float32, or int64 for integer ones); ValueError naming it otherwise."""
    if not isinstance(value, torch.Tensor):
        return _scalar(name, value, B, V)
    return _tensor(name, value, B, V, device, check)


def sampling_params(B, V, device, check, **values):
    """A ``SamplingParams`` from the seven user values (missing ones take the defaults)."""
    return SamplingParams(**{name: normalise_param(name, v, B, V, device, check)
                             for name, v in values.items()})


def check_logits(logits, backend="auto", name="logits"):
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"{name} must be 2-D [B, V], got shape {tuple(logits.shape)}")
    if logits.dtype == torch.float64:
        raise ValueError(f"{name} must be float32/float16/bfloat16, got float64: the sampler's "
                         "math is float32, convert with logits.float()")
    if logits.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be floating point (float32/float16/bfloat16), "
                         f"got dtype {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} has V=0 columns: the vocabulary must have at least one token")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def check_history(input_ids, B, V, device, check):
    if input_ids is None:
        return None
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a 2-D [B, L] integer tensor, got "
                         f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
    if input_ids.shape[0] != B:
        raise ValueError(f"input_ids must have B={B} rows, got shape {tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    if input_ids.device != device:
        raise ValueError(f"input_ids must be on the logits' device {device}, got "
                         f"{input_ids.device}")
    if check and input_ids.numel() > 0:
        mx = int(input_ids.max())
        if mx >= V:
            raise ValueError(f"input_ids contains id {mx}, which is >= the vocabulary size V={V}")
    return input_ids


def check_generator(generator, device):
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {generator!r}")
    gd = generator.device
    if gd.type != device.type or (gd.index is not None and device.index is not None
                                  and gd.index != device.index):
        raise ValueError(f"generator is on {gd}; it must be on the logits' device {device}")


def check_stream(generator, seed, offset, B, V, device):
    """(seed, offset) normalised, or (None, None) when the generator (or torch's) draws."""
    check_generator(generator, device)
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if offset is not None and seed is None:
        raise ValueError(f"offset={fmt(offset)} needs seed: offsets index a seeded stream")
    if seed is None:
        return None, None
    return (normalise_param("seed", seed, B, V, device, False),
            normalise_param("offset", 0 if offset is None else offset, B, V, device, False))


def normalise(logits, values, input_ids=None, prompt_lens=None, generator=None, seed=None,
              offset=None, check=True, backend="auto", vocab_size=None):
    """Validate one sampling call. ``values``: the seven user parameters by name;
    ``vocab_size``: the full vocabulary when ``logits`` is a shard of it. Returns Normalised."""
    check_logits(logits, backend)
    B = logits.shape[0]
    V = logits.shape[1] if vocab_size is None else vocab_size
    dev = logits.device
    params = sampling_params(B, V, dev, check, **values)
    input_ids = check_history(input_ids, B, V, dev, check)
    if prompt_lens is not None:
        prompt_lens = normalise_param("prompt_lens", prompt_lens, B, V, dev, check)
    seed, offset = check_stream(generator, seed, offset, B, V, dev)
    return Normalised(params, input_ids, prompt_lens, seed, offset)


def triton_available():
    """True when triton imports (it may still have no GPU driver to run on)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def pick_backend(backend, logits):
    """"torch" or "triton" for ``backend`` ("auto": the kernel on CUDA tensors)."""
    if backend == "torch":
        return "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package, which does not import")
        if not logits.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend='triton' needs CUDA tensors (logits are on {logits.device});"
                             " set TRITON_INTERPRET=1 before importing gpu_sampler to run the "
                             "kernel on CPU tensors")
        return "triton"
    return "triton" if logits.is_cuda and triton_available() else "torch"


def raise_invalid_row(bad_rows, nan_rows, what):
    """ValueError for the first invalid row; ``nan_rows(r)`` says whether row r holds NaN."""
    r = int(bad_rows.nonzero()[0, 0])
    if nan_rows(r):
        raise ValueError(f"logits row {r} contains NaN")
    raise ValueError(f"logits row {r} has no finite logit left to {what} (all -inf after "
                     "penalties, or an invalid per-row parameter)")


# sample(..., top_logprobs=N): at most 64 (OpenAI-style requests ask up to 20).
MAX_TOP_LOGPROBS = 64
LOGPROBS_MODES = ("raw", "processed")


def check_top_n(top_logprobs, logprobs_mode):
    """N, or None when no top-N is asked for; raises ValueError naming a bad argument."""
    if top_logprobs is None:
        return None
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) \
            or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got "
                         f"{top_logprobs!r}")
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got "
                         f"{logprobs_mode!r}")
    return top_logprobs


def log_cut(value):
    """log(value) in float32 (the same torch op for scalars and per-row tensors), NaN where
    value is outside [0, 1], which makes the row invalid: the cut of min-p (keep x - M >=
    log_cut(min_p)) and of contrastive decoding's head (cd_alpha) on every backend. Both sides
    of the test are exact float32 values the backends share (x - M is one IEEE subtraction), so
    the kept set is the same bit for bit; e^(x - M) >= min_p depended on each backend's exp
    rounding for a token within an ulp of the cut (min_p 1.0: tokens 4e-8 below the max)."""
    if isinstance(value, torch.Tensor):
        ok = (value >= 0) & (value <= 1)
        return torch.where(ok, torch.log(value), float("nan")).contiguous()
    if not 0.0 <= value <= 1.0:
        return float("nan")
    if value == 0.0:  # off (the default): log(0) = -inf exactly, no tensor op
        return float("-inf")
    # a host computation: on the CPU whatever torch's default device is (with a CUDA default
    # device, .item() would synchronise, and raise under CUDA-graph capture)
    return torch.log(torch.tensor(value, dtype=torch.float32, device="cpu")).item()
