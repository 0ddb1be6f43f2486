"""Tensor-parallel LM head + vocab-parallel sampling: no rank ever holds the [B, V] logits.

Every rank runs the same tiny Llama body on the same tokens, then multiplies the last hidden
state by *its own rows* of the lm_head weight (a vocabulary slice, uneven when V % world != 0)
and calls ``gpu_sampler.distributed.sample``. Greedy output equals single-process
``gpu_sampler.generate``; seeded sampling equals it token for token (same per-row seeds
``seed + b`` and offsets = position, as generate uses).

    torchrun --nproc-per-node 4 examples/tp_generate.py            # CPU, gloo
    python -m torch.distributed.run --nproc-per-node 4 examples/tp_generate.py   # the same
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpu_sampler import distributed as gsd


def shard_bounds(V, world, rank):
    """[start, stop) of rank's vocabulary slice: sizes differ by at most one."""
    base, extra = divmod(V, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@torch.no_grad()
def tp_generate(model, input_ids, max_new_tokens, group=None, seed=None, eos_token_id=2,
                pad_token_id=0, **sample_kw):
    """Decode with the lm_head split by rows across ``group``; returns [B, L + steps] on every rank.

    sample_kw: gsd.sample parameters (temperature=0.0 for greedy, top_k, top_p, min_p,
    repetition_penalty, ...). Prompts are unpadded [B, L]; rows stop at eos_token_id like
    generate() (later tokens are pad_token_id)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    V = model.config.vocab_size
    start, stop = shard_bounds(V, world, rank)
    w_local = model.lm_head.weight[start:stop]  # what a TP checkpoint would load on this rank
    B, L = input_ids.shape
    seeds = None if seed is None else seed + torch.arange(B)
    out = input_ids
    unfinished = torch.ones(B, dtype=torch.bool)
    cache, step_ids = None, input_ids
    for i in range(max_new_tokens):
        body = model.model(input_ids=step_ids, past_key_values=cache, use_cache=True)
        cache = body.past_key_values
        local_logits = F.linear(body.last_hidden_state[:, -1], w_local)
        kw = dict(sample_kw)
        if seeds is not None:
            kw.update(seed=seeds, offset=torch.full((B,), L + i))
        tok = gsd.sample(local_logits, vocab_start=start, vocab_size=V, group=group,
                         input_ids=out, prompt_lens=L, **kw)
        tok = torch.where(unfinished, tok, pad_token_id)
        out = torch.cat([out, tok[:, None]], 1)
        unfinished &= tok != eos_token_id
        if not bool(unfinished.any()):
            break
        step_ids = tok[:, None]
    return out


def main():
    import gpu_sampler
    from gpu_sampler.tiny import build_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model(1000, seed=0, hidden_size=64, num_layers=2)  # same weights everywhere
    prompt = torch.tensor([[1, 17, 250, 31, 999], [1, 5, 6, 7, 8]])
    greedy = tp_generate(model, prompt, 12, temperature=0.0)
    sampled = tp_generate(model, prompt, 12, seed=7, temperature=0.8, top_k=40, top_p=0.9,
                          repetition_penalty=1.2)
    if rank == 0:
        ref_g = gpu_sampler.generate(model, prompt, max_new_tokens=12, do_sample=False)
        ref_s = gpu_sampler.generate(model, prompt, max_new_tokens=12, do_sample=True, seed=7,
                                     temperature=0.8, top_k=40, top_p=0.9,
                                     repetition_penalty=1.2)
        print("greedy  ", greedy.tolist(), "matches generate():", torch.equal(greedy, ref_g))
        print("sampled ", sampled.tolist(), "matches generate():", torch.equal(sampled, ref_s))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
