"""transformers names that moved within 5.x, looked up on the installed version.

transformers 5.24 renamed the cache argument of ``generate`` / ``forward`` and the cache field
of the generate outputs from ``past_key_values`` to ``cache`` (the old name is a deprecated
alias until 5.40 / 6.0); the GPU image runs 5.17, which knows only ``past_key_values``.
"""
import dataclasses
import functools
import inspect

OLD, NEW = "past_key_values", "cache"


@functools.lru_cache(maxsize=None)
def _forward_takes_new(forward_fn):
    return NEW in inspect.signature(forward_fn).parameters


def cache_arg(model):
    """The name under which ``model``'s forward takes its cache."""
    fn = getattr(type(model).forward, "__wrapped__", type(model).forward)
    return NEW if _forward_takes_new(fn) or _forward_takes_new(type(model).forward) else OLD


@functools.lru_cache(maxsize=None)
def output_field(output_cls):
    """The cache field of a generate output class (``cache`` from 5.24 on)."""
    names = {f.name for f in dataclasses.fields(output_cls)}
    return NEW if NEW in names else OLD


def make_output(output_cls, cache, **fields):
    """``output_cls(**fields)`` with the cache under the installed version's field name."""
    return output_cls(**fields, **{output_field(output_cls): cache})


@functools.lru_cache(maxsize=None)
def _renamed():
    """transformers 5.24's renames of generate's deprecated cache names (``past_key_values``,
    ``cache_params`` -> ``cache``: its FutureWarning; both names given: a warning, ``cache``
    kept), by its own decorator on a function named like its generate (the warning names it)."""
    from transformers.utils.deprecation import deprecate_kwarg

    @deprecate_kwarg(OLD, "6.0.0", new_name=NEW)
    @deprecate_kwarg("cache_params", "6.0.0", new_name=NEW)
    def generate(self, **kwargs):
        return kwargs
    return generate


def take_cache(model, kwargs):
    """Rename a passed cache to the name the model takes, as transformers' generate does: with
    ``cache`` (5.24) the deprecated names warn and are renamed there; a transformers without
    it takes no ``cache`` argument (ValueError when both names are given)."""
    name = cache_arg(model)
    if name == NEW:
        renamed = _renamed()(model, **kwargs)
        kwargs.clear()
        kwargs.update(renamed)
    elif OLD in kwargs and NEW in kwargs:
        raise ValueError(f"Both `{OLD}` and `{NEW}` are passed: pass only `{NEW}`")
    other = OLD if name == NEW else NEW
    if other in kwargs:
        kwargs[name] = kwargs.pop(other)
    return kwargs


def pop_cache(model_kwargs):
    """Remove and return the passed cache (either name) from generate's model kwargs."""
    a, b = model_kwargs.pop(NEW, None), model_kwargs.pop(OLD, None)
    return a if a is not None else b


def cache_entry(cache):
    """A model-kwargs dict holding ``cache`` under both names (for transformers' helpers that
    read one of them, depending on the version)."""
    return {OLD: cache, NEW: cache}


@functools.lru_cache(maxsize=None)
def beam_sampling_ranks_draws():
    """Whether beam sampling ranks its K multinomial draws by score (transformers >= 5.24
    sorts them; 5.17 keeps the draw order). Read off the installed helper's source: the
    release that changed it is not recorded, and a version bound could only guess."""
    from transformers.generation.utils import GenerationMixin

    try:
        source = inspect.getsource(GenerationMixin._get_top_k_continuations)
    except (OSError, TypeError):  # no source shipped: the current behaviour
        return True
    return "topk_log_probs.sort(" in source


def transformers_config(model, generation_config, kwargs):
    """transformers' config priority (kwargs > generation_config > the model's defaults), as
    its generate resolves it: (generation config, model kwargs, has_default_max,
    has_default_min). Takes the passed cache out of ``kwargs`` under whichever name this
    version uses."""
    defaults = model.generation_config
    has_default_max = (kwargs.get("max_length") is None and (
        generation_config is None or generation_config.max_length is None)
        and defaults.max_length is None)
    has_default_min = (kwargs.get("min_length") is None and (
        generation_config is None or generation_config.min_length is None)
        and defaults.min_length is None)
    take_cache(model, kwargs)
    # transformers' generate pops it first; it only matters for hub generation code (custom
    # generate, deprecated decoding modes), all refused before the loops run.
    kwargs.pop("trust_remote_code", None)
    gc, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    model._validate_model_kwargs(model_kwargs.copy())
    return gc, model_kwargs, has_default_max, has_default_min
