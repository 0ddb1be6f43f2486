"""Contrastive decoding in generate(): the ``amateur_model`` / ``cd_alpha`` / ``cd_beta``
arguments and the amateur model as the decode loop runs it (the scores themselves are the op in
gpu_sampler/contrastive.py)."""
import dataclasses
import inspect
import numbers
from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, DynamicCache

from ..contrastive import cd_given, check_cd_param, contrastive_scores
from ..params import CD_ALPHA, CD_BETA
from . import compat
from .cache import StaticKVCache
from .common import own_cache


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


# Arguments of the expert's forward that the amateur does not share: its own cache, and outputs
# only the expert reports (the amateur needs its last position's logits only).
_NOT_SHARED = frozenset((compat.OLD, compat.NEW, "output_attentions", "output_hidden_states",
                         "logits_to_keep"))


@dataclasses.dataclass(eq=False)
class Amateur:
    """The amateur model of contrastive decoding, run beside the expert on the same inputs.

    It holds what the decode loop needs of it: the model and cd_alpha / cd_beta, its own cache
    (allocated and grown with the expert's buffers), the forward arguments it shares with the
    expert (read from its signature once), and, per step, what it hands to sample().
    """
    model: Any
    alpha: float
    beta: float
    # True: sample() computes the contrastive scores inside its own launches from the
    # amateur's logits; False: they are materialised here (a processor or output needs them).
    fuse: bool = False
    cache: Optional[Cache] = None
    shared: frozenset = dataclasses.field(init=False)
    takes_logits_to_keep: bool = dataclasses.field(init=False)
    cache_arg: str = dataclasses.field(init=False)

    def __post_init__(self):
        params = frozenset(inspect.signature(self.model.forward).parameters)
        self.shared = params - _NOT_SHARED
        self.takes_logits_to_keep = "logits_to_keep" in params
        self.cache_arg = compat.cache_arg(self.model)

    @classmethod
    def from_kwargs(cls, model, kwargs):
        """The amateur generate()'s kwargs ask for (popped from them), or None."""
        args = pop_generate_args(model, kwargs)
        return None if args is None else cls(*args)

    def fused(self, fuse):
        return dataclasses.replace(self, fuse=bool(fuse))

    def start(self, batch, length):
        """Its cache, as long as the expert's mask buffer (they grow together)."""
        self.cache = own_cache(self.model, batch, length) or DynamicCache(
            config=self.model.config)

    def grow(self, length):
        if isinstance(self.cache, StaticKVCache):
            self.cache.grow(length)

    def logits(self, kw, kv, mask):
        """Its last-position logits for the expert's forward arguments `kw` (feeding positions
        from `kv` on; `mask` is the expert's whole mask buffer)."""
        akw = {k: v for k, v in kw.items() if k in self.shared}
        if self.takes_logits_to_keep:
            akw["logits_to_keep"] = 1
        if self.cache is not None:
            akw[self.cache_arg] = self.cache
            if "attention_mask" in akw:
                q = kw["input_ids"].shape[1]
                n = self.cache.attention_mask_length(q) if hasattr(
                    self.cache, "attention_mask_length") else kv + q
                akw["attention_mask"] = mask[:, :n]
        return self.model(**akw).logits[:, -1, :]

    def scores(self, logits, kw, kv, mask):
        """(scores, sample() kwargs) for the expert's `logits`: the contrastive scores, or the
        expert logits unchanged with the amateur's logits for sample() to fuse."""
        amateur_logits = self.logits(kw, kv, mask)
        if self.fuse:
            return logits, dict(amateur_logits=amateur_logits.to(torch.float32, copy=True),
                                cd_alpha=self.alpha, cd_beta=self.beta)
        return contrastive_scores(logits, amateur_logits, cd_alpha=self.alpha,
                                  cd_beta=self.beta, check=False), {}
