"""Raw Triton kernels and their launchers (installed as ``gpu_sampler.kernels``).

Importing this package requires triton. Set TRITON_INTERPRET=1 *before* importing it to run the
kernels on CPU tensors (the interpreter reads the variable when ``@triton.jit`` runs).
"""
from .beam import beam_topk
from .contrastive import contrastive_scores
from .sampling import INVALID_TOKEN, fused_sample

__all__ = ["fused_sample", "beam_topk", "contrastive_scores", "INVALID_TOKEN"]
