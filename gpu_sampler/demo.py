"""The ``gpu-sampler demo`` steps as separate, testable functions.

    load_model(path, device)            from_pretrained of a model folder, with one-line errors
    compare_generate(model, tok, ...)   model.generate vs gpu_sampler.generate (greedy, sampling,
                                        beam search)
    sampler_table(sizes, device)        HF processor chain vs gpu_sampler.sample, median ms
    plot_latency(rows, path)            PNG of latency vs batch x vocab
    run_demo(model_dir, device, out_dir)  all of the above, printed

Example:
    >>> from gpu_sampler import demo
    >>> rows = demo.sampler_table([(2, 1000)], repeats=1)
    >>> print(demo.format_table(rows))  # milliseconds: they vary from run to run
    shape (B, V) | HF chain ms | gpu-sampler ms | ratio
    ...
    (2, 1000) | ... | ... | ...x
"""
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from .hf import generate  # noqa: E402
from .sampler import sample  # noqa: E402

# The embedded model learnt from docstrings: prompts in their register.
PROMPTS = [
    "Return the number of",
    "This module provides",
    "If the file does not exist,",
    "The default value is",
]
# The HF comparison chain: rp 1.2, T 0.7, top-k 50, top-p 0.9, input_ids of 128 tokens.
SAMPLING = dict(repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9)
BEAM = dict(num_beams=4, length_penalty=1.0)
HISTORY = 128
SIZES = [(1, 32000), (8, 32000), (1, 128256), (8, 128256), (64, 128256), (256, 151936)]


class ModelLoadError(ValueError):
    """A model folder that is missing or not a transformers causal LM (message is one line)."""


def check_device(device):
    """Return a torch.device for "cpu" / "cuda[:i]"; ValueError when CUDA is asked for but absent."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r} ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here "
                         f"(torch {torch.__version__}, cuda build: {torch.version.cuda})")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return dev


def check_model_dir(path):
    """The folder as a Path; ModelLoadError when it is missing or has no config.json."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model folder not found: {p}")
    if not p.is_dir():
        raise ModelLoadError(f"model path is not a folder: {p}")
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"not a transformers model folder (no config.json): {p}")
    return p


def load_model(path, device="cpu", trust_remote_code=False):
    """Load ``(model, tokenizer)`` from a local folder with the Auto classes, in eval mode.

    Args:
        path: folder holding config.json, weights and a tokenizer (str or Path).
        device: "cpu" or "cuda".
        trust_remote_code: passed to from_pretrained; only True when the user asked for it.

    Returns:
        (PreTrainedModel on ``device``, tokenizer with left padding and a pad token).

    Raises:
        ModelLoadError: missing folder, or a folder transformers cannot load as a causal LM.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = check_device(device)
    p = check_model_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(p, trust_remote_code=trust_remote_code)
        tok = AutoTokenizer.from_pretrained(p, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises OSError/ValueError/KeyError/... by case
        msg = " ".join(str(e).split()) or type(e).__name__
        if len(msg) > 300:
            msg = msg[:297] + "..."
        raise ModelLoadError(f"could not load a causal LM from {p}: {msg}") from None
    tok.padding_side = "left"  # decoder-only batching pads on the left
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model.to(dev).eval(), tok


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, repeats=3, device="cpu", warmup=1):
    """Median wall seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls.

    Returns:
        (median seconds: float, result of the last call)
    """
    out = None
    for _ in range(warmup):
        out = fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _describe_training(stamp):
    """One line on how the embedded model was made (its folder's stamp)."""
    if not stamp or not stamp.get("steps"):
        return "(random weights: the text is noise; what matters is that both paths agree)"
    return (f"(trained {stamp['steps']} steps on Python stdlib docstrings, loss "
            f"{stamp['losses'][0]:.2f} -> {stamp['final_loss']:.2f} in {stamp['seconds']:.0f} s: "
            f"docstring-flavoured words, not sense)")


def compare_generate(model, tok, prompts=PROMPTS, max_new_tokens=32, repeats=3, seed=0,
                     progress=False):
    """Run ``model.generate`` and ``gpu_sampler.generate`` on one left-padded batch.

    Greedy and beam search (``BEAM``): both with the same arguments; the outputs must be
    token-identical. Sampling: both
    with ``SAMPLING`` (different random streams, so the texts differ) and
    ``min_new_tokens = max_new_tokens`` so both produce the same number of tokens.

    Returns:
        dict with ``greedy`` / ``sample`` / ``beam``, each ``{"hf": texts, "gpu_sampler": texts,
        "hf_tok_s": float, "gs_tok_s": float}``, ``identical`` (bool, greedy),
        ``beam_identical`` (bool, beam search) and ``sample_checked`` (bool: every drawn token
        in transformers' kept set, ``sampled_in_support``).
    """
    dev = model.device
    batch = tok(list(prompts), return_tensors="pt", padding=True).to(dev)
    L = batch.input_ids.shape[1]
    B = batch.input_ids.shape[0]

    def texts(out):
        return tok.batch_decode(out[:, L:], skip_special_tokens=True)

    result = {}
    modes = {"greedy": dict(do_sample=False),
             "sample": dict(do_sample=True, min_new_tokens=max_new_tokens, **SAMPLING),
             "beam": dict(do_sample=False, **BEAM)}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=2 * len(modes), desc="generate comparison", unit="run", leave=False)
    for mode, kw in modes.items():
        kw = dict(kw, max_new_tokens=max_new_tokens)
        with torch.no_grad():
            torch.manual_seed(seed)
            t_hf, hf = time_call(lambda: model.generate(**batch, **kw), repeats, dev)
            if bar is not None:
                bar.update()
            extra = {"seed": seed} if mode == "sample" else {}
            t_gs, gs = time_call(lambda: generate(model, **batch, **kw, **extra), repeats, dev)
            if bar is not None:
                bar.update()
        result[mode] = {"hf": texts(hf), "gpu_sampler": texts(gs),
                        "hf_tok_s": B * (hf.shape[1] - L) / t_hf,
                        "gs_tok_s": B * (gs.shape[1] - L) / t_gs}
        same = hf.shape == gs.shape and bool(torch.equal(hf, gs))
        if mode == "sample":
            result["sample_checked"] = sampled_in_support(model, batch, gs, kw, seed)
        elif mode == "greedy":
            result["identical"] = same
        elif mode == "beam":
            result["beam_identical"] = same
    if bar is not None:
        bar.close()
    return result


def sampled_in_support(model, batch, out, kw, seed):
    """Whether every token of ``out`` (``generate(model, **batch, **kw, seed=seed)``, sampling
    with ``SAMPLING`` and ``min_new_tokens`` = ``max_new_tokens``) lies in transformers' kept set
    for its step: the call rerun with ``output_logits`` (it must give the same tokens), each
    step's raw logits through transformers' own processors on the sequence so far (the
    repetition penalty, EOS held off by min_new_tokens, then ``hf_chain``'s warpers)."""
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

    L = batch["input_ids"].shape[1]
    rec = generate(model, **batch, **kw, seed=seed, return_dict_in_generate=True,
                   output_logits=True)
    if not torch.equal(rec.sequences, out):
        return False
    eos = model.generation_config.eos_token_id
    floor = None if eos is None else MinNewTokensLengthLogitsProcessor(
        L, kw["min_new_tokens"], eos, device=out.device)
    for t, logits in enumerate(rec.logits):
        prefix = out[:, :L + t]
        scores = logits.float()
        if floor is not None:
            scores = floor(prefix, scores)
        scores = hf_chain(scores, prefix, **SAMPLING, return_scores=True)
        if not bool((scores.gather(1, out[:, L + t, None]) > float("-inf")).all()):
            return False
    return True


def contrastive_checked(model, amateur, batch, out, cd_alpha, cd_beta, tol=1e-3):
    """Whether every token of a contrastive ``generate`` output ``out`` holds its step's best
    contrastive score (within ``tol``: a full forward rounds otherwise than the cached steps),
    recomputed from one uncached forward of each model over the whole sequence; a row's tokens
    after its first EOS are not checked (generate pads there)."""
    from .contrastive import contrastive_scores_reference

    L = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"],
                      batch["attention_mask"].new_ones(out.shape[0], out.shape[1] - L)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        e, a = (m(out, attention_mask=mask, position_ids=pos).logits[:, L - 1:-1].float()
                for m in (model, amateur))
    eos = model.generation_config.eos_token_id
    eos = torch.tensor([] if eos is None else eos, device=out.device).reshape(-1)
    live = torch.ones(out.shape[0], dtype=torch.bool, device=out.device)
    for t in range(out.shape[1] - L):
        s = contrastive_scores_reference(e[:, t], a[:, t], cd_alpha, cd_beta)
        tok = out[:, L + t]
        best = s.gather(1, tok[:, None]).squeeze(1) >= s.amax(1) - tol
        if not bool((best | ~live).all()):
            return False
        live &= ~torch.isin(tok, eos)
    return True


def contrastive_generate(model, tok, prompts=PROMPTS, max_new_tokens=32, cd_alpha=0.1,
                         cd_beta=0.5):
    """Greedy contrastive decoding with ``gpu_sampler.generate(..., amateur_model=...)``.

    The amateur is a random 1-layer Llama (hidden 64) with the model's vocabulary size, built
    with ``tiny.build_model``, so any causal LM folder works.

    Returns:
        dict ``{"texts": list[str], "amateur": str, "tok_s": float, "checked": bool}``
        (``contrastive_checked``).
    """
    from . import tiny

    vocab = model.config.get_text_config(decoder=True).vocab_size
    amateur = tiny.build_model(vocab, seed=1, hidden_size=64, num_layers=1).to(model.device)
    batch = tok(list(prompts), return_tensors="pt", padding=True).to(model.device)
    L = batch.input_ids.shape[1]
    t = time.perf_counter()
    out = generate(model, **batch, max_new_tokens=max_new_tokens, do_sample=False,
                   amateur_model=amateur, cd_alpha=cd_alpha, cd_beta=cd_beta)
    _sync(model.device)
    dt = time.perf_counter() - t
    n = sum(p.numel() for p in amateur.parameters())
    return {"texts": tok.batch_decode(out[:, L:], skip_special_tokens=True),
            "amateur": f"random 1-layer Llama, {n / 1e6:.2f}M parameters",
            "tok_s": out.shape[0] * (out.shape[1] - L) / dt,
            "checked": contrastive_checked(model, amateur, batch, out, cd_alpha, cd_beta)}


def hf_chain(logits, input_ids, repetition_penalty, temperature, top_k, top_p,
             return_scores=False):
    """transformers' processors + softmax + torch.multinomial: what model.generate does per step.

    Returns:
        LongTensor [B].
    """
    from transformers.generation.logits_process import (
        LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
        TopKLogitsWarper, TopPLogitsWarper)

    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(repetition_penalty),
                                 TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k),
                                 TopPLogitsWarper(top_p)])
    scores = procs(input_ids, logits.clone() if return_scores else logits)
    if return_scores:
        return scores
    return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)


def sampler_table(sizes=SIZES, device="cpu", repeats=3, seed=0, progress=False):
    """Median latency of the HF chain and of ``gpu_sampler.sample`` per (B, V), same inputs.

    Inputs: fp32 logits ~ N(0, 3^2), input_ids [B, 128], ``SAMPLING`` parameters.

    Returns:
        list of dicts ``{"B", "V", "hf_ms", "gs_ms", "ratio"}`` (ratio = hf_ms / gs_ms).
    """
    dev = check_device(device)
    it = sizes
    if progress:
        from tqdm import tqdm
        it = tqdm(sizes, desc="sampler comparison", unit="shape", leave=False)
    rows = []
    g = torch.Generator().manual_seed(seed)
    for B, V in it:
        logits = (torch.randn(B, V, generator=g) * 3).to(dev)
        ids = torch.randint(0, V, (B, HISTORY), generator=g).to(dev)
        with torch.no_grad():
            t_hf, _ = time_call(lambda: hf_chain(logits, ids, **SAMPLING), repeats, dev)
            t_gs, tok = time_call(lambda: sample(logits, input_ids=ids, **SAMPLING), repeats, dev)
            # A time is only reported for checked output: every token inside HF's kept set.
            kept = hf_chain(logits, ids, **SAMPLING, return_scores=True).gather(1, tok[:, None])
            if not bool(torch.isfinite(kept).all()):
                raise RuntimeError(f"gpu_sampler.sample drew outside the support at {(B, V)}")
        rows.append({"B": B, "V": V, "hf_ms": t_hf * 1e3, "gs_ms": t_gs * 1e3,
                     "ratio": t_hf / t_gs})
        del logits, ids
    return rows


def format_table(rows):
    """The sampler rows as an aligned text table."""
    head = f"{'shape (B, V)':>16} | {'HF chain ms':>11} | {'gpu-sampler ms':>14} | {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{'(%d, %d)' % (r['B'], r['V']):>16} | {r['hf_ms']:>11.3f} | "
                     f"{r['gs_ms']:>14.3f} | {r['ratio']:>5.1f}x")
    return "\n".join(lines)


def plot_latency(rows, path, title=None):
    """Write a log-log PNG of latency vs batch x vocab for both providers; return its Path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["B"] * r["V"])
    x = [r["B"] * r["V"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(x, [r["hf_ms"] for r in rows], "o-", label="HF processors + multinomial")
    ax.plot(x, [r["gs_ms"] for r in rows], "s-", label="gpu_sampler.sample")
    for r, xi in zip(rows, x):
        ax.annotate(f"{r['ratio']:.1f}x", (xi, r["gs_ms"]), textcoords="offset points",
                    xytext=(0, -12), ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.08, y=0.12)  # room for the ratio labels under the lowest points
    ax.set_xlabel("batch x vocab (logits per call)")
    ax.set_ylabel("median latency per call (ms)")
    ax.set_title(title or "Sampling latency (rp 1.2, T 0.7, top-k 50, top-p 0.9)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _speed(res, checked):
    """The tokens/s line of a comparison; no number for output that did not check out."""
    if not checked:
        return "tokens/s not reported: the output did not check out"
    return f"tokens/s: HF {res['hf_tok_s']:.0f}, gpu-sampler {res['gs_tok_s']:.0f}"


def quiet_transformers():
    """Silence transformers' weight-loading progress bars and warnings for CLI output."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _echo_generate(gen, max_new_tokens, echo):
    """Section [2]'s greedy and sampling lines (compare_generate's dict)."""
    B = len(PROMPTS)
    echo("")
    echo(f"[2] greedy, batch {B}, {max_new_tokens} new tokens: model.generate vs "
         "gpu_sampler.generate")
    g = gen["greedy"]
    for p, a in zip(PROMPTS, g["hf"]):
        echo(f"    {p!r} -> {a!r}")
    echo(f"    identical: {'yes' if gen['identical'] else 'NO'}")
    echo("    " + _speed(g, gen["identical"]))
    s = gen["sample"]
    echo("")
    echo("    sampling (rp 1.2, T 0.7, top-k 50, top-p 0.9): different random streams, "
         "same distribution")
    for p, a, b in zip(PROMPTS, s["hf"], s["gpu_sampler"]):
        echo(f"    {p!r}")
        echo(f"        HF:          {a!r}")
        echo(f"        gpu-sampler: {b!r}")
    echo(f"    every drawn token in transformers' kept set: "
         f"{'yes' if gen['sample_checked'] else 'NO'}, {_speed(s, gen['sample_checked'])}")


def _echo_contrastive(cd, echo):
    """Section [2]'s contrastive decoding lines (contrastive_generate's dict): tokens/s only
    for checked output."""
    echo("")
    cd_speed = (f"{cd['tok_s']:.0f} tokens/s" if cd["checked"] else
                "tokens/s not reported: a token is not its step's best score")
    echo(f"    contrastive decoding (greedy, cd_alpha 0.1, cd_beta 0.5; amateur: {cd['amateur']}):"
         f" each token its step's best score (uncached forward): "
         f"{'yes' if cd['checked'] else 'NO'}, {cd_speed}")
    for p, a in zip(PROMPTS, cd["texts"]):
        echo(f"    {p!r} -> {a!r}")


def run_demo(model_dir=None, device="cpu", out_dir="gpu-sampler-demo", sizes=SIZES,
             max_new_tokens=32, repeats=3, echo=None):
    """The whole demo: load, greedy/sampling generate comparison, sampler table, plot.

    Args:
        model_dir: a model folder; None builds/loads the embedded tiny Llama.
        device: "cpu" or "cuda".
        out_dir: where the PNG goes (created).
        echo: called with each line of output.

    Returns:
        dict with "generate" (compare_generate's dict), "table" (sampler rows), "plot" (Path).
    """
    from . import tiny

    if echo is None:
        def echo(line):
            # Flushed so that lines and the progress bars on stderr appear in order.
            print(line, flush=True)
    started = time.perf_counter()
    dev = check_device(device)
    if model_dir is not None:
        check_model_dir(model_dir)
    quiet_transformers()
    backend = "Triton kernel" if dev.type == "cuda" else "torch twin (CPU)"
    echo(f"gpu-sampler demo  (device {dev}, sampler backend: {backend}, torch "
         f"{torch.__version__}, {torch.get_num_threads()} threads)")
    if model_dir is None:
        if not tiny.is_built(tiny.default_cache_dir() / "tiny-llama"):
            echo("building the embedded tiny model (once, about two minutes on two cores; "
                 "cached for later runs) ...")
        model_dir = tiny.ensure_default_model()
        what = "embedded tiny Llama"
    else:
        what = "model"
    model, tok = load_model(model_dir, dev)
    n = sum(p.numel() for p in model.parameters())

    echo("")
    echo(f"[1] {what}: {model_dir}")
    echo(f"    {type(model).__name__}, {n / 1e6:.2f}M parameters, vocab {model.config.vocab_size}")
    if what != "model":
        echo(f"    {_describe_training(tiny.read_stamp(model_dir))}")

    gen = compare_generate(model, tok, max_new_tokens=max_new_tokens, repeats=repeats,
                           progress=True)
    _echo_generate(gen, max_new_tokens, echo)
    _echo_contrastive(contrastive_generate(model, tok, max_new_tokens=max_new_tokens), echo)
    bm = gen["beam"]
    echo(f"    beam search ({BEAM['num_beams']} beams): identical "
         f"{'yes' if gen['beam_identical'] else 'NO'}, {_speed(bm, gen['beam_identical'])}")

    rows = sampler_table(sizes, dev, repeats=repeats, progress=True)
    echo("")
    echo(f"[3] one sampling step (rp 1.2, T 0.7, top-k 50, top-p 0.9, input_ids [B, {HISTORY}]),"
         f" median of {repeats}")
    for line in format_table(rows).splitlines():
        echo("    " + line)

    png = plot_latency(rows, Path(out_dir) / f"sampler-latency-{dev.type}.png",
                       title=f"Sampling latency on {dev.type} (rp 1.2, T 0.7, k 50, p 0.9)")
    echo("")
    echo(f"[4] plot: {png.resolve()}")
    echo(f"done in {time.perf_counter() - started:.0f} s")
    return {"generate": gen, "table": rows, "plot": png}
