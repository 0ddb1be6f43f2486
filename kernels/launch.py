"""Host-side helpers every launcher uses (no kernels here): sizes and parameter passing.

``log_alpha`` (contrastive decoding's cut) is the parameter module's rule, shared with the torch
twin: gpu_sampler.params is a leaf that imports neither ops nor kernels.
"""
import torch

from gpu_sampler.params import log_alpha  # noqa: F401 (absolute: works however kernels/ is found)


def next_pow2(n):
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def split_param(value, dummy):
    """(pointer tensor, scalar, is_tensor) for a number-or-(B,) parameter: a kernel takes both
    and reads the pointer only when IS_TENSOR (``dummy`` stands in for the pointer)."""
    if isinstance(value, torch.Tensor):
        return value.contiguous(), 0, True
    return dummy, value, False
