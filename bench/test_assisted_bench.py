"""pytest-benchmark: assisted generation, gpu_sampler.generate vs transformers' model.generate.

    .venv/bin/python -m pytest bench/test_assisted_bench.py -q --benchmark-columns=median,iqr

Greedy, fp32, a ~20M-parameter Llama (hidden 256, 4 layers, vocab 32000) as the target; every
row generates exactly NEW_TOKENS tokens (``eos_token_id=None``) from a repetitive prompt: 8
tokens repeated 4 times (one 8-token cycle per row). Two targets:

* ``cyclic``: the random model with its layers' output projections damped (x 0.03) and its head
  rewired to a bigram table that follows each prompt's cycle: its text repeats the prompt, so
  drafts are mostly accepted (speculation's good case);
* ``random``: the random model as is: nothing it writes repeats, and a draft agrees with it by
  chance only (the overhead case: about 0 accepted per step).

Two kinds of drafts: ``lookup``: ``prompt_lookup_num_tokens=4``; ``draft``: ``assistant_model``
= a 1-layer model holding the target's embeddings, first layer and head, with
``num_assistant_tokens=4``, ``assistant_confidence_threshold=0`` (constant schedule).
Providers: ``gpu_sampler`` (B = 1 and B = 8), ``hf`` (transformers' assisted generate, B = 1
only: it refuses batches), ``plain`` (mode ``none``: gpu_sampler without drafts, the
baseline). Every
provider's sequences are checked equal to plain greedy first. ``extra_info`` holds tokens/s
(B * NEW_TOKENS / median) and ``accepted_per_step``: tokens per row per target forward, minus
one (the prompt goes with the first step in both; at B = 8 every step verifies every row, so
this is the batch's rate).
"""
import os

import pytest
import torch

from gpu_sampler.hf.generation import generate
from tests.models import llama_20m, tiny_model

QUICK = bool(os.environ.get("GPU_SAMPLER_BENCH_QUICK"))
NEW_TOKENS = 16 if QUICK else 32
ROUNDS = 1 if QUICK else 3
V = 32000
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [pytest.param(target, mode, b, p, id=f"{target}-{mode}-b{b}-{p}")
         for target in ("cyclic", "random") for b in (1, 8)
         for mode, p in [("none", "plain"), ("lookup", "gpu_sampler"), ("lookup", "hf"),
                         ("draft", "gpu_sampler"), ("draft", "hf")] if not (p == "hf" and b > 1)]

_cache = {}


def _cycles():
    return torch.randint(3, V, (8, 8), generator=torch.Generator().manual_seed(0))


def _target(kind):
    model = llama_20m(vocab_size=V)
    if kind == "cyclic":
        cycles = _cycles().flatten()
        succ = torch.randperm(V, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(0.03)
                layer.mlp.down_proj.weight.mul_(0.03)
            emb, head = model.model.embed_tokens.weight, model.lm_head.weight
            head[succ] = emb                  # token x is followed by succ[x] ...
            head[succ[cycles]] = 0            # ... except in the prompts' cycles
            head[_cycles().roll(-1, 1).flatten()] = emb[cycles]
    return model.to(DEVICE)


def _draft(target):
    draft = tiny_model("llama", seed=0, vocab_size=V, hidden_size=256, num_layers=1,
                       num_heads=8, num_kv_heads=4, intermediate_size=688,
                       max_position_embeddings=2048)
    draft.load_state_dict(target.state_dict(), strict=False)  # layer 0, embeddings, head
    cfg = draft.generation_config
    cfg.num_assistant_tokens, cfg.assistant_confidence_threshold = 4, 0.0
    cfg.num_assistant_tokens_schedule = "constant"
    return draft.to(DEVICE)


def _models(kind):
    if kind not in _cache:
        _cache.clear()  # one target at a time keeps memory flat
        target = _target(kind)
        _cache[kind] = (target, _draft(target))
    return _cache[kind]


def _prompts(B):
    return _cycles()[:B].repeat(1, 4).to(DEVICE)


class _Forwards:
    """Counts the target's forward calls."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.n += 1


@pytest.mark.parametrize("kind,mode,batch,provider", CASES)
def test_assisted_throughput(benchmark, kind, mode, batch, provider):
    target, draft = _models(kind)
    ids = _prompts(batch)
    kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    extra = {} if mode == "none" else (
        dict(prompt_lookup_num_tokens=4) if mode == "lookup" else dict(assistant_model=draft))
    call = target.generate if provider == "hf" else (lambda x, **k: generate(target, x, **k))

    def run():
        return call(ids, **kw, **extra)

    expected = generate(target, ids, **kw)
    forwards = _Forwards(target)
    out = run()
    forwards.handle.remove()
    assert torch.equal(out, expected)
    steps = forwards.n  # both fold the prompt into the first step; plain: one per token
    out = benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    assert out.shape == (batch, ids.shape[1] + NEW_TOKENS)
    benchmark.extra_info.update(
        tokens_per_s=batch * NEW_TOKENS / benchmark.stats.stats.median,
        tokens_per_s_best=batch * NEW_TOKENS / benchmark.stats.stats.min,
        accepted_per_step=NEW_TOKENS / steps - 1, target_forwards=steps, target=kind,
        mode=mode, batch=batch, provider=provider, new_tokens=NEW_TOKENS, device=DEVICE,
        torch=torch.__version__, threads=torch.get_num_threads())
