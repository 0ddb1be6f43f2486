"""A small continuous-batching loop: requests join and leave slots, each with its own sampling
parameters, seed, top-N logprobs and allowed-token mask, sampled by one gpu_sampler.Sampler.

    python examples/serving_loop.py            # CPU, a tiny random Llama, prints each request

The model is recomputed over the whole (left-padded) batch every step, to keep the example
about the sampler; a real server keeps a KV cache per slot.
"""
import dataclasses

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import gpu_sampler

V = 256


@dataclasses.dataclass
class Request:
    name: str
    prompt: list
    max_new: int
    params: dict
    seed: int
    allowed: torch.Tensor = None  # bool [V]: e.g. a grammar's current token set
    top_n: int = 3
    out: list = dataclasses.field(default_factory=list)
    top: list = dataclasses.field(default_factory=list)


def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def batch_logits(model, seqs):
    """Last-position logits for every slot: a request's sequence, or zeros for a free slot
    (its row is sampled and ignored, so the batch keeps one shape: CUDA-graph friendly)."""
    live = [s for s in seqs if s is not None]
    width = max(len(s) for s in live)
    ids = torch.tensor([[0] * (width - len(s)) + s for s in live])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in live])
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        last = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    out = torch.zeros(len(seqs), V)
    out[[i for i, s in enumerate(seqs) if s is not None]] = last
    return out


def step(model, sampler, slots, table):
    """One decode step for every slot; `table[i]` is slot i's request or None."""
    logits = batch_logits(model, [r.prompt + r.out if r else None for r in table])
    allowed = torch.stack([r.allowed if r is not None and r.allowed is not None
                           else torch.ones(V, dtype=torch.bool) for r in table])
    top_n = max(r.top_n for r in table if r is not None)
    out = sampler(logits, slots, allowed_mask=gpu_sampler.pack_mask(allowed), top_logprobs=top_n)
    for i, r in enumerate(table):
        if r is None:
            continue
        r.out.append(int(out.tokens[i]))
        r.top.append(list(zip(out.top_ids[i, :r.top_n].tolist(),
                              [round(v, 3) for v in out.top_logprobs[i, :r.top_n].tolist()])))


def serve(requests, max_batch=3, model=None):
    """Run `requests`, each joining the first free slot; returns them in finishing order."""
    model = model or tiny_model()
    slots = gpu_sampler.SamplingSlots(max_batch)
    sampler = gpu_sampler.Sampler(max_batch, V)
    waiting, table, done = list(requests), [None] * max_batch, []
    while waiting or any(table):
        for i in range(max_batch):
            if table[i] is None and waiting:  # join: the slot is reset in place, once
                table[i] = r = waiting.pop(0)
                slots.set_row(i, seed=r.seed, offset=len(r.prompt), **r.params)
        step(model, sampler, slots, table)  # advances every slot's offset by one
        for i, r in enumerate(table):
            if r is not None and len(r.out) >= r.max_new:  # leave
                done.append(r)
                table[i] = None
    return done


def example_requests():
    digits = torch.zeros(V, dtype=torch.bool)
    digits[48:58] = True  # only the "digit" ids 48..57, as a grammar might allow
    return [
        Request("greedy", [5, 6, 7], 6, dict(temperature=0.0), seed=1),
        Request("top-p", [9, 10], 8, dict(temperature=0.8, top_p=0.9), seed=2),
        Request("digits only", [11, 12, 13], 5, dict(temperature=1.0), seed=3, allowed=digits),
        Request("top-k", [14], 4, dict(temperature=0.7, top_k=20), seed=4, top_n=5),
        Request("min-p", [15, 16], 7, dict(temperature=1.0, min_p=0.1), seed=5),
    ]


if __name__ == "__main__":
    for r in serve(example_requests()):
        print(f"{r.name:12s} {r.params} -> {r.out}")
        print(f"{'':12s} first step top-{r.top_n}: {r.top[0]}")
