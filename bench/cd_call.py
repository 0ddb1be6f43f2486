"""``sample()`` with contrastive decoding, for tools that call ``fn(logits, input_ids=..., **kw)``.

The amateur logits are 0.6 x + N(0, 1) (fixed seed), correlated with the expert's as in
bench/traffic.py --cd; cd_alpha 0.1, cd_beta 0.5. Used for the modelled H200 time of the fused
path (docs/notes.md):

    python ../shared/tools/gpu_model.py --project . --callable bench.cd_call:sample_cd \\
        --defaults '{"backend": "triton", "seed": 1, "check": false}' \\
        --case '64,128256,128,{"top_k": 50, "top_p": 0.9, "temperature": 0.7, "repetition_penalty": 1.2}'
"""
import torch

import gpu_sampler


def sample_cd(logits, input_ids=None, **kw):
    g = torch.Generator().manual_seed(1)
    amateur = logits.float() * 0.6 + torch.randn(logits.shape, generator=g)
    return gpu_sampler.sample(logits, input_ids=input_ids, amateur_logits=amateur.to(logits.dtype),
                              cd_alpha=0.1, cd_beta=0.5, **kw)


def sample_cd_separate(logits, input_ids=None, **kw):
    """The unfused path for comparison: the scores kernel, then sample() on the [B, V] scores."""
    from gpu_sampler.contrastive import contrastive_scores
    g = torch.Generator().manual_seed(1)
    amateur = logits.float() * 0.6 + torch.randn(logits.shape, generator=g)
    scores = contrastive_scores(logits, amateur.to(logits.dtype), cd_alpha=0.1, cd_beta=0.5,
                                check=False, backend=kw.get("backend", "auto"))
    return gpu_sampler.sample(scores, input_ids=input_ids, **kw)
