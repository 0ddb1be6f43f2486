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

Copies of a patched model (``copy.deepcopy``, pickle, ``torch.save`` / ``torch.load``) are
patched, bound to themselves, with their own copy of the patch state. Two things make that
work. Pickle finds a class by module and qualname, which for the subclass name the original
class, so the subclass pickles as the original class and is rebuilt on load
(:meth:`_Delegated.__reduce_ex__`). A plain model's ``generate`` is a :class:`_PatchedGenerate`
in the instance's ``__dict__``: a bound method there would pickle as a ``getattr`` of its
function's name on the model, which fails on load.
"""
import inspect
import threading
import types
import warnings

from transformers.generation.utils import GenerationMixin

from . import compat, seq2seq, whisper
from .common import Unsupported, unwrap_compiled
from .generation import EXTRA_ARGS, generate

__all__ = ["patch", "unpatch"]

_SAVED = "_gpu_sampler_saved_generate"
_STATE = "_gpu_sampler_patch"


def _original(model):
    saved = model.__dict__.get(_SAVED)
    return saved if saved is not None else types.MethodType(type(model).generate, model)


class _PatchedGenerate:
    """A patched model's ``generate``, in the instance's ``__dict__``. Not a bound method:
    pickle stores one as ``getattr(model, its function's name)``, which an unpickled model does
    not have. This one reduces to ``_PatchedGenerate(model)``; deepcopy and pickle reach
    ``model`` through their memo, so a copy's ``generate`` is bound to the copy."""

    __slots__ = ("__self__",)

    def __init__(self, model):
        self.__self__ = model

    def __call__(self, *args, **kwargs):
        model = self.__self__
        return _run(model, generate, _original(model), args, kwargs)

    def __reduce__(self):
        return _PatchedGenerate, (self.__self__,)

    # What code reads off the bound method it replaces (its name for logs and decorators,
    # ``inspect.signature`` for the accepted arguments, ``__func__``) reads the same after patch.
    @property
    def __name__(self):
        return _original(self.__self__).__name__

    def __getattr__(self, name):  # a property named __qualname__ would be the class's qualname
        if name == "__qualname__":
            return _original(self.__self__).__qualname__
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def __func__(self):
        return _original(self.__self__).__func__

    @property
    def __wrapped__(self):
        return _original(self.__self__)

    @property
    def __signature__(self):
        return inspect.signature(_original(self.__self__))


def _state(model):
    """The patch state. An instance that was built by a delegating class itself (say
    ``type(patched).from_pretrained(...)``) never went through patch(): patch()'s defaults."""
    return model.__dict__.setdefault(_STATE, {"fallback": True, "warned": set()})


def _run(model, ours, theirs, args, kwargs):
    """``ours(model, *args, **kwargs)``, or ``theirs(*args, **kwargs)`` (transformers) with one
    warning per model and feature where gpu_sampler refuses the call and may hand it over."""
    state = _state(model)
    # a deprecated cache name is renamed (transformers' FutureWarning) once for both paths:
    # a call handed over warns once, as transformers' generate alone does
    kwargs = compat.take_cache(model, dict(kwargs))
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

    def __reduce_ex__(self, protocol):
        # pickle looks the class up by module and qualname, finds the original class (the
        # subclass has its names) and refuses to pickle the subclass. Reduce as the original
        # class; _rebuild_delegated swaps the subclass back in on load. The state (the
        # instance's __dict__, patch state included) is restored by pickle as usual.
        rebuild, args, *rest = super().__reduce_ex__(protocol)
        cls, *more = args  # (cls, ...) for copyreg.__newobj__ and copyreg._reconstructor alike
        return (_rebuild_delegated, (rebuild, _original_class(cls), *more), *rest)


def _rebuild_delegated(rebuild, cls, *args):
    """Unpickles a patched delegating model: what pickle would have done for the delegating
    subclass of ``cls`` (``rebuild(subclass, *args)``), which it cannot name."""
    return rebuild(_delegating_class(cls), *args)


def _original_class(delegating):
    """The class a delegating subclass was built from (its first base)."""
    return delegating.__bases__[0]


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

    A copy of a patched model (``copy.deepcopy``, ``pickle``, ``torch.save`` then
    ``torch.load(..., weights_only=False)``) is patched: its ``generate`` runs on the copy,
    with the same ``fallback`` and its own record of the features already warned about;
    ``unpatch`` on the copy leaves the original patched. ``save_pretrained`` saves what the
    unpatched model saves (the config's "architectures" names the original class), and
    ``from_pretrained`` with the original class or an Auto class loads an unpatched model.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from gpu_sampler import patch, unpatch
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32,
        ...     num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        ...     eos_token_id=None)).eval()  # random weights: no early stop, a fixed shape
        >>> patch(model) is model   # model.generate(...) now uses gpu_sampler
        True
        >>> ids = torch.tensor([[5, 6, 7]])
        >>> model.generate(ids, max_new_tokens=2, do_sample=True, seed=0).shape  # seed: ours
        torch.Size([1, 5])
        >>> unpatch(model) is model  # back to transformers' generate
        True
    """
    inner = unwrap_compiled(model)
    if inner is not model:  # torch.compile(model): its generate is the module's; patch that
        patch(inner, fallback)
        return model
    current = model.__dict__.get("generate")
    if isinstance(current, _PatchedGenerate) or isinstance(model, _Delegated):
        _state(model)["fallback"] = bool(fallback)
        return model
    model.__dict__[_STATE] = {"fallback": bool(fallback), "warned": set()}
    if whisper.delegates(model):
        model.__class__ = _delegating_class(type(model))
        return model
    model.__dict__[_SAVED] = current
    model.__dict__["generate"] = _PatchedGenerate(model)
    return model


def unpatch(model):
    """Undo :func:`patch`: ``model.generate`` is what it was before. Returns the model.

    Example: see :func:`patch`; unpatching a model that is not patched changes nothing.
    """
    inner = unwrap_compiled(model)
    if inner is not model:
        unpatch(inner)
        return model
    if isinstance(model, _Delegated):
        model.__class__ = _original_class(type(model))
        model.__dict__.pop(_STATE, None)
        return model
    if not isinstance(model.__dict__.get("generate"), _PatchedGenerate):
        return model
    saved = model.__dict__.pop(_SAVED, None)
    model.__dict__.pop(_STATE, None)
    if saved is None:
        del model.__dict__["generate"]
    else:
        model.__dict__["generate"] = saved
    return model
