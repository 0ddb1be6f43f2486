"""``patch(model)``: ``model.generate`` runs gpu_sampler's generate, and never breaks code that
ran before: what gpu_sampler does not support is handed to transformers' own generate, with
one warning per model and feature (``patch(model, fallback=False)`` raises instead).

gpu_sampler's refusals (``Unsupported``) are raised while the call's arguments are resolved,
before the model runs, a cache is written or random numbers are drawn, so handing the same
arguments to transformers is the call the user would have made without the patch.

A model whose own ``generate`` prepares the call and delegates each decoding loop to
``super().generate`` (Whisper: :func:`gpu_sampler.hf.whisper.delegates`) keeps its generate:
the instance's class becomes a subclass of its own whose MRO puts :class:`_Delegated` right
before ``GenerationMixin``, so that ``super().generate`` inside the model's generate reaches
gpu_sampler's loop (same refusal and fallback rules, applied to that inner call). Only this
instance changes class; nothing global is patched, so other instances and threads are not
affected.
"""
import threading
import types
import warnings

from transformers.generation.utils import GenerationMixin

from . import seq2seq, whisper
from .common import Unsupported
from .generation import EXTRA_ARGS, generate

__all__ = ["patch", "unpatch"]

_SAVED = "_gpu_sampler_saved_generate"
_STATE = "_gpu_sampler_patch"


def _original(model):
    saved = model.__dict__.get(_SAVED)
    return saved if saved is not None else types.MethodType(type(model).generate, model)


def _patched_generate(model, *args, **kwargs):
    return _run(model, generate, _original(model), args, kwargs)


def _run(model, ours, theirs, args, kwargs):
    """``ours(model, *args, **kwargs)``, or ``theirs(*args, **kwargs)`` (transformers) with one
    warning per model and feature where gpu_sampler refuses the call and may hand it over."""
    state = model.__dict__[_STATE]
    try:
        return ours(model, *args, **kwargs)
    except Unsupported as exc:
        extras = sorted(name for name in EXTRA_ARGS if kwargs.get(name) is not None)
        if not state["fallback"] or extras:
            if extras:  # transformers would drop or refuse them: not the call the user made
                exc.add_note(f"not handed to transformers' generate: it has no {extras}")
            raise
        if exc.feature not in state["warned"]:
            state["warned"].add(exc.feature)
            warnings.warn(f"gpu_sampler: {exc} - this call (and later ones with {exc.feature}) "
                          f"runs transformers' generate for {type(model).__name__}",
                          UserWarning, stacklevel=3)
        return theirs(*args, **kwargs)


class _Delegated(GenerationMixin):
    """Sits right before GenerationMixin in a patched delegating model's MRO: the model's own
    ``generate`` (Whisper's) calls ``super().generate(...)``, which lands here."""

    def generate(self, *args, **kwargs):
        theirs = types.MethodType(GenerationMixin.generate, self)
        return _run(self, seq2seq.generate_delegated, theirs, args, kwargs)


_SUBCLASSES = {}
_SUBCLASSES_LOCK = threading.Lock()


def _delegating_class(cls):
    """``cls`` with _Delegated before GenerationMixin in its MRO (one per class, reused)."""
    with _SUBCLASSES_LOCK:
        sub = _SUBCLASSES.get(cls)
        if sub is None:
            # Same names as cls: repr(), save_pretrained's "architectures" and warnings read
            # the model's class name.
            sub = type(cls.__name__, (cls, _Delegated),
                       {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
            _SUBCLASSES[cls] = sub
        return sub


def patch(model, fallback=True):
    """Make ``model.generate`` run :func:`gpu_sampler.generate` (this instance only).

    Args:
        model: a transformers model with ``generate``.
        fallback: True (default): arguments or models gpu_sampler does not support run
            transformers' generate, with one UserWarning per model and feature; False: they
            raise NotImplementedError as :func:`gpu_sampler.generate` does.

    Returns the model. Patching again only updates ``fallback``. Whisper keeps its own
    ``generate``; the decoding loops it delegates to ``super().generate`` run gpu_sampler's
    encoder-decoder loop (this instance gets a subclass of its class; ``unpatch`` restores it).

    Example:
        >>> from gpu_sampler import patch, unpatch
        >>> patch(model)            # model.generate(...) now uses gpu_sampler  # doctest: +SKIP
        >>> unpatch(model)          # back to transformers' generate            # doctest: +SKIP
    """
    current = model.__dict__.get("generate")
    if getattr(current, "__func__", None) is _patched_generate or isinstance(model, _Delegated):
        model.__dict__[_STATE]["fallback"] = bool(fallback)
        return model
    model.__dict__[_STATE] = {"fallback": bool(fallback), "warned": set()}
    if whisper.delegates(model):
        model.__class__ = _delegating_class(type(model))
        return model
    model.__dict__[_SAVED] = current
    model.__dict__["generate"] = types.MethodType(_patched_generate, model)
    return model


def unpatch(model):
    """Undo :func:`patch`: ``model.generate`` is what it was before. Returns the model."""
    if isinstance(model, _Delegated):
        model.__class__ = type(model).__bases__[0]
        model.__dict__.pop(_STATE, None)
        return model
    current = model.__dict__.get("generate")
    if getattr(current, "__func__", None) is not _patched_generate:
        return model
    saved = model.__dict__.pop(_SAVED, None)
    model.__dict__.pop(_STATE, None)
    if saved is None:
        del model.__dict__["generate"]
    else:
        model.__dict__["generate"] = saved
    return model
