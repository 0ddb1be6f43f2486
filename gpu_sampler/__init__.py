"""gpu-sampler: fused LLM token sampling, a static KV cache and a drop-in generate().

    sample(logits, ...)                 one token per row (Triton on CUDA, torch twin on CPU)
    sampling_distribution(logits, ...)  the exact [B, V] distribution sample() draws from
    contrastive_scores(logits, ...)     contrastive-decoding scores; beam_topk(...) the beam step
    speculative_sample(target, drafts)  speculative decoding's verification step
    pack_mask(allowed)                  a bool [B, V] mask as sample()'s allowed_mask bitmask
    Sampler, SamplingSlots              a persistent sampler for serving loops
    StaticKVCache(config, B, max_len)   preallocated, in-place transformers Cache
    generate(model, ...), patch(model)  drop-in for model.generate

The ops import torch only; the transformers integration (gpu_sampler.hf) is imported when one
of its names is first used, so ``sample()`` alone never loads transformers.
"""
from .beam import beam_topk
from .contrastive import contrastive_scores
from .edits import pack_mask
from .speculative import speculative_sample
from .sampler import SampleOutput, sample, sampling_distribution, triton_available
from .serving import Sampler, SamplingSlots

__version__ = "0.1.0"

_HF_NAMES = ("StaticKVCache", "generate", "patch", "unpatch")

__all__ = ["sample", "sampling_distribution", "SampleOutput", "contrastive_scores", "beam_topk",
           "speculative_sample", "pack_mask", "Sampler", "SamplingSlots", "triton_available", "__version__",
           *_HF_NAMES]


def __getattr__(name):
    # PEP 562: a failing transformers import raises here, at the first use, with its own error.
    if name in _HF_NAMES:
        from . import hf
        return getattr(hf, name)
    raise AttributeError(f"module 'gpu_sampler' has no attribute {name!r}")
