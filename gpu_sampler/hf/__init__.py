"""transformers integration: generate(), patch(), beam search, the static KV cache.

Imports transformers; ``import gpu_sampler`` loads this package only when one of these names
is first used.
"""
from .cache import StaticKVCache
from .generation import generate
from .patch import patch, unpatch

__all__ = ["StaticKVCache", "generate", "patch", "unpatch"]
