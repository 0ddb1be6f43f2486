"""``check=False`` with every parameter a tensor never reads a tensor's value on the host.

README: ``sample(..., check=False)`` "never synchronises" and is CUDA-graph safe. A recorder
notes, with the library frame that asked, every host read of a tensor value in the launch path:
``.item()`` / ``bool()`` / ``int()`` / ``float()`` (``aten._local_scalar_dense``), data-dependent
shapes (``nonzero``, ``masked_select``, ``unique``, boolean indexing), ``torch.equal``,
``.tolist()`` / ``.numpy()`` / ``.cpu()``, and ``torch.tensor(python data, device=...)`` (a
host-to-device copy a CUDA graph would replay stale). Reads made while the Triton interpreter
runs a kernel are not the launch path's (the interpreter copies arguments to numpy), so the
recorder is off inside ``InterpretedFunction.run``. On CUDA the calls also run under
``torch.cuda.set_sync_debug_mode("error")``.
"""
import contextlib
import threading
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpu_sampler
from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="needs the Triton backend")

SYNC_OPS = {"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "is_nonzero",
            "equal", "allclose", "_unique", "_unique2", "unique_dim", "unique_consecutive",
            "argwhere", "bincount", "histc"}
_state = threading.local()


def _where():
    """The innermost library frame (gpu_sampler/ or kernels/), or None outside the library."""
    for fr in reversed(traceback.extract_stack()[:-2]):
        path = fr.filename.replace("\\", "/")
        if "/tests/" not in path and ("/gpu_sampler/" in path or "/kernels/" in path):
            return f"{path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}:{fr.lineno}"
    return None


def _note(reads, kind):
    if not getattr(_state, "off", False):
        where = _where()
        if where is not None:
            reads.append(f"{kind} at {where}")


def _bool_index(args):
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in (idx if isinstance(idx, (list, tuple)) else (idx,)))


class _Mode(TorchDispatchMode):
    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in SYNC_OPS or (name in ("index", "index_put", "index_put_") and _bool_index(args)):
            _note(self.reads, "aten." + name)
        return func(*args, **(kwargs or {}))


def _spy(monkeypatch, reads, owner, name, pred=None):
    orig = getattr(owner, name)

    def spy(*args, **kwargs):
        if pred is None or pred(*args, **kwargs):
            _note(reads, name)
        return orig(*args, **kwargs)
    monkeypatch.setattr(owner, name, spy)


@pytest.fixture
def host_reads(monkeypatch):
    """A context manager factory: ``with host_reads() as reads:`` collects the reads."""
    reads = []
    for name in ("tolist", "numpy", "__array__", "cpu"):  # not dispatched for CPU tensors
        _spy(monkeypatch, reads, torch.Tensor, name)
    on_device = lambda data=None, *a, **k: (k.get("device") is not None  # noqa: E731
                                            and not isinstance(data, torch.Tensor))
    _spy(monkeypatch, reads, torch, "tensor", on_device)
    _spy(monkeypatch, reads, torch, "as_tensor", on_device)
    try:
        from triton.runtime import interpreter as ti
        run = ti.InterpretedFunction.run

        def quiet(self, *args, **kwargs):
            _state.off = True
            try:
                return run(self, *args, **kwargs)
            finally:
                _state.off = False
        monkeypatch.setattr(ti.InterpretedFunction, "run", quiet)
    except ImportError:
        pass

    @contextlib.contextmanager
    def recording():
        sync = (torch.cuda.set_sync_debug_mode if DEVICE == "cuda" else None)
        if sync:
            sync("error")
        try:
            with _Mode(reads):
                yield reads
        finally:
            if sync:
                sync("default")
    return recording


B, V = 4, 2048


def _t(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype, device=DEVICE)


def _rows(seed=0, b=B, v=V):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _params(**over):
    """Every sampling parameter a [B] tensor, a seed and an offset tensor, check=False."""
    kw = dict(temperature=_t(0.7, 1.0, 0.0, 1.3), top_k=_t(0, 0, 0, 0, dtype=torch.int64),
              top_p=_t(1.0, 1.0, 1.0, 1.0), min_p=_t(0.0, 0.0, 0.0, 0.0),
              repetition_penalty=_t(1.0, 1.0, 1.0, 1.0), presence_penalty=_t(0.0, 0.0, 0.0, 0.0),
              frequency_penalty=_t(0.0, 0.0, 0.0, 0.0), seed=_t(11, 12, 13, 14, dtype=torch.int64),
              offset=_t(3, 4, 5, 6, dtype=torch.int64), check=False, backend="triton")
    kw.update(over)
    return kw


def _penalties():
    hist = torch.randint(0, V, (B, 24), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    hist[0, -3:] = -1
    return dict(repetition_penalty=_t(1.2, 1.0, 1.1, 1.3), presence_penalty=_t(0.2, 0, 0.5, 0.1),
                frequency_penalty=_t(0.1, 0, 0.3, 0.2), input_ids=hist,
                prompt_lens=_t(10, 0, 5, 24, dtype=torch.int64))


def _edits():
    allowed = torch.rand(B, V, generator=torch.Generator().manual_seed(3)) < 0.5
    ids = torch.tensor([[1, 2, -1, 5]] * B, device=DEVICE)
    return dict(allowed_mask=gpu_sampler.pack_mask(allowed.to(DEVICE)),
                logit_bias=(ids, torch.full((B, 4), 2.0, device=DEVICE)))


def _cd():
    return dict(amateur_logits=_rows(9), cd_alpha=_t(0.1, 0.2, 0.1, 0.05),
                cd_beta=_t(0.5, 0.5, 1.0, 0.0))


def _confident():
    x = _rows(1) * 3
    x[:, 7] += 30
    return x


SAMPLE_CASES = {
    "greedy": lambda: (_rows(), _params(temperature=_t(0, 0, 0, 0))),
    "pure_temperature": lambda: (_rows(), _params()),
    "top_k": lambda: (_rows(), _params(top_k=_t(5, 50, 1, 200, dtype=torch.int64))),
    "top_p_flat": lambda: (_rows(v=4096), _params(top_p=_t(0.95, 0.95, 0.9, 0.95))),
    "top_p_confident": lambda: (_confident(), _params(top_p=_t(0.9, 0.95, 0.5, 0.99))),
    "min_p": lambda: (_rows(), _params(min_p=_t(0.05, 0.1, 0.01, 0.2))),
    "mixed_logprobs": lambda: (_rows(), _params(
        top_k=_t(0, 40, 0, 0, dtype=torch.int64), top_p=_t(1, 1, 0.9, 1),
        min_p=_t(0, 0, 0, 0.05), return_logprobs=True)),
    "penalties": lambda: (_rows(), _params(top_p=_t(1, 1, 0.9, 1), **_penalties())),
    "mask_bias": lambda: (_rows(), _params(top_p=_t(0.9, 1, 0.95, 1), **_edits())),
    "top_raw": lambda: (_rows(), _params(top_logprobs=5, **_edits())),
    "top_processed": lambda: (_rows(), _params(top_logprobs=4, logprobs_mode="processed",
                                               top_p=_t(0.9, 1, 0.95, 1), **_penalties())),
    "contrastive": lambda: (_rows(), _params(top_p=_t(0.9, 1, 1, 1), **_cd())),
    # raw top-N over contrastive scores with a mask / bias (the scores materialised)
    "contrastive_edits_top_raw": lambda: (_rows(), _params(top_logprobs=3, **_cd(), **_edits())),
    "contrastive_top_processed": lambda: (_rows(), _params(top_logprobs=3,
                                                           logprobs_mode="processed", **_cd())),
    "no_seed": lambda: (_rows(), {k: v for k, v in _params().items()
                                  if k not in ("seed", "offset")}),
}


@pytest.mark.parametrize("case", sorted(SAMPLE_CASES))
def test_sample_check_false_reads_nothing_on_the_host(case, host_reads):
    logits, kw = SAMPLE_CASES[case]()
    with host_reads() as reads:
        gpu_sampler.sample(logits, **kw)
    assert reads == [], reads


def test_sampling_distribution_reads_nothing_on_the_host(host_reads):
    kw = {k: v for k, v in _params(top_p=_t(0.9, 1, 0.95, 1), min_p=_t(0, 0.1, 0, 0),
                                   **_penalties(), **_edits()).items()
          if k not in ("seed", "offset")}
    with host_reads() as reads:
        gpu_sampler.sampling_distribution(_rows(), **kw)
    assert reads == [], reads


@pytest.mark.parametrize("probs", [False, True])
def test_speculative_sample_reads_nothing_on_the_host(probs, host_reads):
    K, v = 3, 1024
    g = torch.Generator().manual_seed(2)
    target = torch.randn(2, K + 1, v, generator=g).to(DEVICE)
    drafts = torch.randint(0, v, (2, K), generator=g).to(DEVICE)
    q = torch.softmax(torch.randn(2, K, v, generator=g), -1).to(DEVICE) if probs else None
    kw = dict(temperature=_t(0.7, 1.0), top_k=_t(0, 20, dtype=torch.int64), top_p=_t(0.9, 1.0),
              min_p=_t(0.0, 0.0), repetition_penalty=_t(1.1, 1.0), presence_penalty=_t(0, 0.2),
              frequency_penalty=_t(0, 0.1), seed=_t(1, 2, dtype=torch.int64),
              offset=_t(0, 5, dtype=torch.int64), prompt_lens=_t(2, 3, dtype=torch.int64),
              input_ids=torch.randint(0, v, (2, 6), generator=g).to(DEVICE))
    with host_reads() as reads:
        gpu_sampler.speculative_sample(target, drafts, q, check=False, backend="triton",
                                       return_logprobs=True, **kw)
    assert reads == [], reads


def test_sampler_call_reads_nothing_on_the_host(host_reads):
    slots = gpu_sampler.SamplingSlots(4, device=DEVICE)
    sampler = gpu_sampler.Sampler(4, V, device=DEVICE)
    for i in range(4):
        slots.set_row(i, temperature=0.8, top_p=0.9, seed=i)
    mask = _edits()["allowed_mask"][:3]
    with host_reads() as reads:
        sampler(_rows()[:3], slots, backend="triton", return_logprobs=True)
        sampler(_rows()[:3], slots, backend="triton", top_logprobs=2, allowed_mask=mask)
    assert reads == [], reads


def test_the_recorder_sees_host_reads(host_reads):
    """check=True validates tensor values (documented to synchronise): the recorder sees it."""
    with host_reads() as reads:
        gpu_sampler.sample(_rows(v=256), **_params(check=True))
    assert any("_local_scalar_dense" in r for r in reads), reads


def test_host_scalars_stay_on_the_host_whatever_the_default_device():
    """Python-number parameters are turned into kernel scalars on the CPU: with torch's default
    device set (a serving stack's torch.set_default_device("cuda")) that work must not land on
    it (an .item() there synchronises, and raises under CUDA-graph capture). ``meta`` stands in
    for the device: an .item() on it raises."""
    x, a = _rows(v=512), _rows(1, v=512)
    seed, offset = _t(1, 2, 3, 4, dtype=torch.int64), _t(0, 1, 2, 3, dtype=torch.int64)
    slots = gpu_sampler.SamplingSlots(2, device=DEVICE)
    with torch.device("meta"):
        gpu_sampler.sample(x, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=seed,
                           offset=offset, check=False, backend="triton")
        gpu_sampler.sample(x, amateur_logits=a, cd_alpha=0.2, seed=seed, offset=offset,
                           check=False, backend="triton")
        gpu_sampler.sampling_distribution(x, min_p=0.1, check=False, backend="triton")
        slots.set_row(0, temperature=0.5)  # its seed drawn from torch's generator
