"""gpu-sampler: fused LLM token sampling, a static KV cache and a drop-in generate().

    sample(logits, ...)                 one token per row (Triton on CUDA, torch twin on CPU)
    sampling_distribution(logits, ...)  the exact [B, V] distribution sample() draws from
    StaticKVCache(config, B, max_len)   preallocated, in-place transformers Cache
    generate(model, ...), patch(model)  drop-in for model.generate
"""
from .sampler import sample, sampling_distribution, triton_available

__version__ = "0.1.0"

__all__ = ["sample", "sampling_distribution", "triton_available", "__version__"]

try:  # the HF integration layer lands in its own modules
    from .cache import StaticKVCache  # noqa: F401
    from .generation import generate, patch, unpatch  # noqa: F401
    __all__ += ["StaticKVCache", "generate", "patch", "unpatch"]
except ImportError:  # pragma: no cover - only while those modules are absent
    pass
