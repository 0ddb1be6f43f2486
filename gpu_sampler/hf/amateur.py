"""Contrastive decoding in generate(): the ``amateur_model`` / ``cd_alpha`` / ``cd_beta``
arguments (the scores themselves are the op in gpu_sampler/contrastive.py)."""
import numbers

import torch

from ..contrastive import cd_given, check_cd_param
from ..params import CD_ALPHA, CD_BETA


def _vocab_size(model):
    return getattr(model.config.get_text_config(decoder=True), "vocab_size", None)


def pop_generate_args(model, kwargs):
    """Take ``amateur_model``, ``cd_alpha``, ``cd_beta`` out of generate()'s kwargs.

    Returns None (no amateur) or ``(amateur, cd_alpha, cd_beta)``; raises ValueError for
    cd_alpha / cd_beta without an amateur, bad values, or vocabularies of different sizes.
    """
    amateur = kwargs.pop("amateur_model", None)
    alpha = kwargs.pop("cd_alpha", CD_ALPHA)
    beta = kwargs.pop("cd_beta", CD_BETA)
    if amateur is None:
        for name, v, default in (("cd_alpha", alpha, CD_ALPHA), ("cd_beta", beta, CD_BETA)):
            if cd_given(v, default):
                raise ValueError(f"{name}={v!r} needs amateur_model (contrastive decoding)")
        return None
    if getattr(amateur.config, "is_encoder_decoder", False):
        raise NotImplementedError("amateur_model must be a decoder-only model")
    for name, v in (("cd_alpha", alpha), ("cd_beta", beta)):
        if isinstance(v, torch.Tensor):
            raise ValueError(f"{name} must be a number in generate(), got a tensor")
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"{name} must be a number, got {v!r}")
    alpha = check_cd_param("cd_alpha", alpha, 1, None)
    beta = check_cd_param("cd_beta", beta, 1, None)
    ve, va = _vocab_size(model), _vocab_size(amateur)
    if ve != va:
        raise ValueError(f"amateur_model has a vocabulary of {va} tokens but model has {ve}: "
                         f"contrastive decoding needs the same vocabulary in both models")
    return amateur, alpha, beta
