"""Row kinds and the mixed serving batch of bench/workloads.py, without its interpreter setup
(bench/model_call.py imports them inside gpu_model.py's probe)."""
import numpy as np
import torch

KINDS = ("sigma3", "confident", "flat", "powerlaw")


def row_logits(kind, rows, V, seed=0):
    """[rows, V] float32 logits of one row kind (module docstring)."""
    g = torch.Generator().manual_seed(seed + 1000 * KINDS.index(kind))
    if kind == "sigma3":
        return torch.randn(rows, V, generator=g) * 3
    if kind == "confident":
        x = torch.randn(rows, V, generator=g) * 1.5
        for r in range(rows):
            top = torch.randperm(V, generator=g)[:3]
            x[r, top] = torch.tensor([14.0, 12.5, 11.0])
        return x
    if kind == "flat":
        return torch.randn(rows, V, generator=g)
    if kind == "powerlaw":
        out = torch.empty(rows, V)
        for r in range(rows):
            rank = torch.randperm(V, generator=g).to(torch.float64) + 1
            # the log in numpy float64 (then rounded): torch's float32 log on this CPU gave
            # other bits in ~1 process of 12 (twenty-first session), so two runs of a
            # comparison (bench/same_bits.py) could see different rows
            lg = torch.from_numpy(np.log(rank.numpy())).to(torch.float32)
            out[r] = -1.1 * lg + 0.1 * torch.randn(V, generator=g)
        return out
    raise ValueError(kind)


# name -> (kwargs, history length)
SETTINGS = {
    "greedy": (dict(temperature=0.0), 0),
    "greedy+logprobs": (dict(temperature=0.0), 0),  # the kernel always returns the logprob
    "T1.0": (dict(temperature=1.0), 0),
    "T0.6 p0.9": (dict(temperature=0.6, top_p=0.9), 0),
    "T1.0 p0.95": (dict(temperature=1.0, top_p=0.95), 0),
    "T1.0 minp0.05": (dict(temperature=1.0, min_p=0.05), 0),
    "T0.7 k20 p0.8 rep1.05": (dict(temperature=0.7, top_k=20, top_p=0.8,
                                   repetition_penalty=1.05), 128),
    "T1.0 k50": (dict(temperature=1.0, top_k=50), 0),
    "mixed": (None, 0),
}
MIXED_ROWS = 5


def mixed_kwargs(rows):
    """Per-row tensors: greedy, T 1.0, T 1.0 p 0.95, T 0.7 k 50, T 1.0 min-p 0.05, repeated."""
    t = [0.0, 1.0, 1.0, 0.7, 1.0]
    k = [0, 0, 0, 50, 0]
    p = [1.0, 1.0, 0.95, 1.0, 1.0]
    mp = [0.0, 0.0, 0.0, 0.0, 0.05]
    pick = [i % 5 for i in range(rows)]
    return dict(temperature=torch.tensor([t[i] for i in pick]),
                top_k=torch.tensor([k[i] for i in pick], dtype=torch.int64),
                top_p=torch.tensor([p[i] for i in pick]),
                min_p=torch.tensor([mp[i] for i in pick]))


def request_edits(rows, V, gen):
    """A request's mask (half the vocabulary allowed) and 20 logit-bias entries, as
    gpu_sampler/edits.py hands them to the launcher."""
    from gpu_sampler import edits
    words = edits.pack_mask(torch.rand(rows, V, generator=gen) < 0.5)
    bias = (torch.randint(0, V, (rows, 20), generator=gen), torch.randn(rows, 20, generator=gen))
    ed = edits.prepare_edits(torch.empty(rows, V), words, bias, False)
    return dict(allowed_words=ed.words, logit_bias=(ed.bias_ids, ed.bias_values))
