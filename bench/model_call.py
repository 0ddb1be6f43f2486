"""The fused sampler with the stage-1 chunk plan of a chosen batch size, for
../shared/tools/gpu_model.py (``fn(logits, input_ids=..., **kw)``).

The model runs 2 of the B rows under the interpreter and spreads their per-program cost over the
real grid. At B = 2 the launcher splits a row into ~126 one-block programs, so each block pays a
program's fixed cost (prologue, loop fill) that the real B = 64 grid (13 blocks a program) pays
once per 13 blocks. Passing ``plan_batch=B`` makes the 2 modelled rows use B's plan, so the
measured programs are the real ones (docs/notes.md, kernels/README.md):

    python ../shared/tools/gpu_model.py --project . --callable bench.model_call:sample_plan \\
        --case '64,128256,128,{"plan_batch": 64, "top_k": 50, "top_p": 0.9, "temperature": 0.7,
                               "repetition_penalty": 1.2}'

``row_kind`` (bench/workloads.py: "sigma3", "confident", "flat", "powerlaw") replaces the tool's
N(0, 3^2) rows by rows of that kind (same shape and dtype), and ``mixed=true`` gives the rows
the per-row parameters of workloads.py's mixed serving batch (greedy, T 1.0, T 1.0 p 0.95,
T 0.7 k 50, T 1.0 min-p 0.05, repeated; run it with ``--rows 5`` so every kind of row is traced);
``edits=true`` adds a request's token mask and 20 logit-bias entries a row; ``top_n`` (and
``top_n_raw``) asks for top-N logprobs:

    python ../shared/tools/gpu_model.py --project . --callable bench.model_call:sample_plan \\
        --rows 5 --case '64,128256,0,{"plan_batch": 64, "mixed": true, "seed": 1}'
"""
import os

from gpu_sampler.kernels.sampling import fused_sample

if os.environ.get("TRITON_INTERPRET") == "1":  # the probe's trace: kernels/interpreter.py
    from gpu_sampler.kernels.interpreter import skip_repeated_language_patching
    skip_repeated_language_patching()


def sample_plan(logits, input_ids=None, plan_batch=None, row_kind=None, mixed=False,
                edits=False, **kw):
    B, V = logits.shape
    if edits:  # a request's mask and 20 logit-bias entries a row (bench/rows.py)
        import torch
        from bench.rows import request_edits
        ed = request_edits(B, V, torch.Generator().manual_seed(0))
        kw = dict(kw, allowed_words=ed["allowed_words"].to(logits.device),
                  logit_bias=tuple(t.to(logits.device) for t in ed["logit_bias"]))
    if row_kind is not None:
        from bench.rows import row_logits
        logits = row_logits(row_kind, B, V).to(device=logits.device, dtype=logits.dtype)
    if mixed:
        from bench.rows import mixed_kwargs
        kw = dict(kw, **{k: v.to(logits.device) for k, v in mixed_kwargs(B).items()})
    return fused_sample(logits, input_ids=input_ids, plan_batch=plan_batch, **kw)


def speculative_plan(logits, input_ids=None, plan_batch=None, K=4, with_q=False, **kw):
    """``speculative_sample()`` on the Triton backend over the rows as [B / (K + 1), K + 1, V]
    target logits (run it with ``--rows`` a multiple of K + 1), one-hot drafts or draft
    distributions (``with_q``), the launches planned for ``plan_batch`` rows:

        python ../shared/tools/gpu_model.py --project . --rows 5 \\
            --callable bench.model_call:speculative_plan \\
            --case '40,128256,0,{"plan_batch": 40, "K": 4, "top_k": 50, "top_p": 0.9,
                                 "temperature": 0.7}'
    """
    import functools
    import torch
    import gpu_sampler
    from gpu_sampler import kernels
    B, V = logits.shape
    target = logits.view(B // (K + 1), K + 1, V)
    gen = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, V, (B // (K + 1), K), generator=gen).to(logits.device)
    q = torch.softmax(target[:, :K].float() * 0.8, -1) if with_q else None
    saved = kernels.fused_sample
    kernels.fused_sample = functools.partial(saved, plan_batch=plan_batch)
    try:
        return gpu_sampler.speculative_sample(target, drafts, q, seed=1, check=False,
                                              backend="triton", **kw)
    finally:
        kernels.fused_sample = saved
