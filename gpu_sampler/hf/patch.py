"""``patch(model)``: ``model.generate`` runs gpu_sampler's generate, and never breaks code that
ran before: what gpu_sampler does not support is handed to transformers' own generate, with
one warning per model and feature (``patch(model, fallback=False)`` raises instead).

gpu_sampler's refusals (``Unsupported``) are raised while the call's arguments are resolved,
before the model runs, a cache is written or random numbers are drawn, so handing the same
arguments to transformers is the call the user would have made without the patch.
"""
import types
import warnings

from .common import Unsupported
from .generation import EXTRA_ARGS, generate

__all__ = ["patch", "unpatch"]

_SAVED = "_gpu_sampler_saved_generate"
_STATE = "_gpu_sampler_patch"


def _original(model):
    saved = model.__dict__.get(_SAVED)
    return saved if saved is not None else types.MethodType(type(model).generate, model)


def _patched_generate(model, *args, **kwargs):
    state = model.__dict__[_STATE]
    try:
        return generate(model, *args, **kwargs)
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
                          UserWarning, stacklevel=2)
        return _original(model)(*args, **kwargs)


def patch(model, fallback=True):
    """Make ``model.generate`` run :func:`gpu_sampler.generate` (this instance only).

    Args:
        model: a transformers model with ``generate``.
        fallback: True (default): arguments or models gpu_sampler does not support run
            transformers' generate, with one UserWarning per model and feature; False: they
            raise NotImplementedError as :func:`gpu_sampler.generate` does.

    Returns the model. Patching again only updates ``fallback``.

    Example:
        >>> from gpu_sampler import patch, unpatch
        >>> patch(model)            # model.generate(...) now uses gpu_sampler  # doctest: +SKIP
        >>> unpatch(model)          # back to transformers' generate            # doctest: +SKIP
    """
    current = model.__dict__.get("generate")
    if getattr(current, "__func__", None) is _patched_generate:
        model.__dict__[_STATE]["fallback"] = bool(fallback)
        return model
    model.__dict__[_SAVED] = current
    model.__dict__[_STATE] = {"fallback": bool(fallback), "warned": set()}
    model.__dict__["generate"] = types.MethodType(_patched_generate, model)
    return model


def unpatch(model):
    """Undo :func:`patch`: ``model.generate`` is what it was before. Returns the model."""
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
