"""The embedded default model: a small Llama trained on stdlib docstrings, built offline.

No model hub is needed. The first ``ensure_default_model()`` collects the docstrings of a fixed
list of Python standard-library modules (text every Python install has), trains a ByteLevel BPE
tokenizer (4096 entries) and a 2.4M-parameter Llama on them for a few hundred steps (about two
minutes on two CPU cores), and saves the folder. Everything then loads it the ordinary
way (``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``), so the demo
and the CLI exercise the same loading path as a real checkpoint. Its continuations are
docstring-flavoured English words, so greedy and sampled text can be told apart by eye.

``train_steps=0`` (or ``GPU_SAMPLER_TINY_STEPS=0``) builds the old untrained model instead: a
random-weight Llama with a tokenizer fitted to a few sentences, in about a second, for tests.

Example:
    >>> from gpu_sampler import tiny
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> path = tiny.ensure_default_model(train_steps=0)  # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path)  # doctest: +SKIP
    >>> tok = AutoTokenizer.from_pretrained(path)  # doctest: +SKIP
    >>> ids = tok(["Return the number of"], return_tensors="pt").input_ids  # doctest: +SKIP
    >>> model.generate(ids, max_new_tokens=4, do_sample=False).shape[0]  # doctest: +SKIP
    1
"""
import importlib
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Bump when the recipe changes, so that an old cached folder is rebuilt rather than reused:
# the folder counts as complete only when it holds a file of this name (a JSON stamp).
RECIPE = "tiny-llama-v2-stdlib-docstrings"
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
TOKENIZER_VOCAB = 2000  # the untrained test model's tokenizer (CORPUS runs out near 900)
STEPS_ENV = "GPU_SAMPLER_TINY_STEPS"

# The trained default model. Sized so that training takes about two minutes on two CPU cores
# (0.37 s per step of 32 x 64 tokens measured on an idle 2-core machine, 0.6 s on a busy one)
# and the loss falls from ln(4096) = 8.3 to about 5.1: docstring-flavoured phrases.
TRAIN = dict(
    seed=0,
    vocab_size=4096,      # BPE entries, special tokens included
    hidden_size=192, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
    seq_len=64, batch_size=32,
    steps=360,
    lr=3e-3, min_lr_ratio=0.1, warmup=20, weight_decay=0.01, clip=1.0,
    max_chars=600_000,    # cap on the corpus (the list below gives about 0.45 MB on 3.11)
)

# The corpus: docstrings of these standard-library modules, in this order. Only pure-Python,
# always-present modules (no tkinter, curses, readline ...), so every install has them. The
# text follows the running Python's stdlib, so a different Python version gives a slightly
# different corpus (and model); the same Python and seed give the same one.
STDLIB_MODULES = """
abc argparse ast asyncio base64 bisect bz2 calendar cmd codecs collections colorsys
configparser contextlib copy csv dataclasses datetime decimal difflib dis doctest email enum
filecmp fileinput fnmatch fractions ftplib functools getopt gettext glob gzip hashlib heapq hmac
html http.client http.server imaplib inspect io ipaddress itertools json keyword linecache locale
logging lzma mailbox mimetypes numbers operator optparse os pathlib pickle pkgutil platform
plistlib poplib pprint profile pstats queue quopri random re reprlib sched secrets selectors
shelve shlex shutil smtplib socket socketserver statistics string struct subprocess symtable
sysconfig tabnanny tarfile tempfile textwrap threading timeit token tokenize trace traceback
types typing unittest urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom
zipfile zipimport
""".split()

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a tiny language model that lived on a small computer.",
    "It read every sentence twice and remembered almost nothing.",
    "Every morning the model woke up, loaded its weights and waited for a prompt.",
    "The weather today is sunny with a light breeze from the west.",
    "Tomorrow it will rain in the morning and clear up in the afternoon.",
    "She opened the window, and the smell of fresh bread filled the kitchen.",
    "He walked to the station, bought a ticket and caught the last train home.",
    "A language model predicts the next token from the tokens before it.",
    "Greedy decoding always picks the most probable next token.",
    "Sampling draws the next token at random from the processed distribution.",
    "Temperature makes the distribution sharper when it is small and flatter when it is large.",
    "Top-k keeps only the k most likely tokens; top-p keeps the smallest set above p.",
    "Min-p drops every token much less likely than the best one.",
    "A repetition penalty makes the model less eager to say the same thing again.",
    "The cache stores the keys and values of every token seen so far.",
    "A graphics processor reads memory very fast and runs thousands of threads at once.",
    "Reading the logits once from memory is the floor for any sampler.",
    "The cat sat on the mat and watched the birds in the garden.",
    "My favourite colours are blue, green and a warm shade of orange.",
    "We counted one, two, three, four, five, six, seven, eight, nine and ten.",
    "In the middle of the night the old clock in the hall struck twelve.",
    "The river winds through the valley past farms, forests and a quiet village.",
    "Please write a short story about a robot who learns to paint.",
    "The robot painted the sea, the sky and the little boat between them.",
    "What is the capital of France? The capital of France is Paris.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The library opens at nine and closes at five on weekdays.",
    "Thank you for reading, and have a wonderful day!",
    "Hello, world! This is a test of the tiny model.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \"",
]


def default_cache_dir():
    """``$GPU_SAMPLER_CACHE`` if set, else ``~/.cache/gpu-sampler``; the model lives in
    ``<that>/tiny-llama``."""
    root = os.environ.get("GPU_SAMPLER_CACHE") or os.path.join("~", ".cache", "gpu-sampler")
    return Path(root).expanduser()


def _prose(doc):
    """The paragraphs of a docstring that read as prose, each joined into one line.

    Whitespace runs become one space. Dropped: paragraphs with doctest lines (``>>>``), short ones (< 40 characters) and ones
    where less than 85% of the characters are letters or spaces (tables, code, signatures).
    """
    out = []
    for para in re.split(r"\n\s*\n", doc):
        lines = [ln.strip() for ln in para.splitlines()]
        if any(ln.startswith((">>>", "...")) for ln in lines):
            continue
        text = " ".join(" ".join(lines).split())  # one line, single spaces
        if len(text) < 40 or sum(c.isalpha() or c == " " for c in text) < 0.85 * len(text):
            continue
        out.append(text)
    return out


def _docstrings(module):
    mod = importlib.import_module(module)
    yield inspect.getdoc(mod)
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            yield inspect.getdoc(obj)
        if inspect.isclass(obj):
            for meth_name, meth in sorted(vars(obj).items()):
                if not meth_name.startswith("_") and inspect.isfunction(meth):
                    yield inspect.getdoc(meth)


def stdlib_corpus(modules=STDLIB_MODULES, max_chars=TRAIN["max_chars"]):
    """Prose paragraphs from the docstrings of ``modules``, in a fixed order, deduplicated.

    For each module: its own docstring, then its public classes and functions by name (a class's
    public methods right after it). The total is capped at ``max_chars`` characters.

    Returns:
        list[str], one paragraph per entry.

    Example:
        >>> paras = stdlib_corpus(["textwrap"])
        >>> "wrap" in paras[0]
        True
    """
    seen, out, total = set(), [], 0
    for module in modules:
        for doc in _docstrings(module):
            for para in _prose(doc or ""):
                if para in seen:
                    continue
                if total + len(para) > max_chars:
                    return out
                seen.add(para)
                out.append(para)
                total += len(para) + 1
    return out


def build_tokenizer(vocab_size=TOKENIZER_VOCAB, corpus=CORPUS):
    """A ByteLevel BPE tokenizer trained on ``corpus``, as a left-padding PreTrainedTokenizerFast.

    Special tokens: ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2. The trained vocabulary is smaller
    than ``vocab_size`` when the corpus runs out of merges (about 900 entries for ``CORPUS``).

    Returns:
        transformers.PreTrainedTokenizerFast

    Example:
        >>> tok = build_tokenizer()
        >>> tok.decode(tok("Hello, world!").input_ids)
        'Hello, world!'
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, padding_side="left")


def build_model(vocab_size, seed=0, hidden_size=128, num_layers=4):
    """A random-weight LlamaForCausalLM (fp32, eval mode), deterministic given ``seed``.

    Args:
        vocab_size: int, at least the tokenizer's ``len(tok)``.
        seed: int; the same seed gives the same weights on every machine.
        hidden_size, num_layers: model size (defaults: 128, 4 -> about 1M parameters
            at a 1000-token vocabulary).

    Returns:
        transformers.LlamaForCausalLM with pad/bos/eos ids 0/1/2 in its generation_config.

    Example:
        >>> m = build_model(1000)
        >>> m(torch.tensor([[1, 5, 6]])).logits.shape
        torch.Size([1, 3, 1000])
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=hidden_size * 3, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return seeded_random_model(lambda: LlamaForCausalLM(config), seed, std=0.1)


def seeded_random_model(build, seed, std):
    """build() under a fixed seed, matrices re-drawn from N(0, std), special ids 0/1/2, eval.

    The default init (std 0.02) gives nearly uniform next-token distributions, so greedy output
    would be one token repeated; wider weights give peaked, varied predictions.
    """
    from transformers import GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return model.eval()


def trained_model_config(vocab_size, cfg=None):
    """The LlamaConfig of the trained default model (``TRAIN`` sizes, tied embeddings)."""
    from transformers import LlamaConfig

    cfg = {**TRAIN, **(cfg or {})}
    return LlamaConfig(vocab_size=vocab_size, hidden_size=cfg["hidden_size"],
                       intermediate_size=cfg["intermediate_size"],
                       num_hidden_layers=cfg["num_layers"],
                       num_attention_heads=cfg["num_heads"],
                       num_key_value_heads=cfg["num_kv_heads"],
                       max_position_embeddings=1024, tie_word_embeddings=True,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def lr_at(step, steps, lr, warmup, min_lr_ratio):
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``lr * min_lr_ratio``."""
    warmup = min(warmup, max(steps // 5, 1))
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(steps - warmup, 1)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train_default_model(out_dir, steps=None, echo=print, log_every=25, **overrides):
    """Build the trained default model in ``out_dir`` (in this process); return the stamp dict.

    Collects ``stdlib_corpus()``, trains the tokenizer on it, then trains a Llama
    (``trained_model_config``) from a seeded init with AdamW on random windows of the token
    stream (the paragraphs joined by spaces), and saves model + tokenizer with
    ``save_pretrained``. Deterministic given ``TRAIN["seed"]`` on a given machine and thread count
    (float summation order may differ across CPUs).

    Args:
        out_dir: folder to write (created).
        steps: optimizer steps (default ``TRAIN["steps"]``).
        echo: called with progress lines (every ``log_every`` steps and a summary).
        overrides: any ``TRAIN`` key (tests shrink ``max_chars``).

    Returns:
        dict: recipe, steps, corpus sizes, ``losses`` (every step), ``final_loss`` (mean of the
        last 10 steps), ``seconds``.
    """
    from transformers import GenerationConfig, LlamaForCausalLM

    cfg = {**TRAIN, **overrides}
    steps = cfg["steps"] if steps is None else int(steps)
    started = time.perf_counter()
    paras = stdlib_corpus(max_chars=cfg["max_chars"])
    tok = build_tokenizer(cfg["vocab_size"], corpus=paras)
    # One running text, paragraphs joined by a space: no </s> in the data, so greedy decoding
    # runs on for all its new tokens instead of stopping after one sentence.
    data = torch.tensor(tok(" ".join(paras), add_special_tokens=False).input_ids)
    T, B = cfg["seq_len"], cfg["batch_size"]
    echo(f"corpus: docstrings of {len(STDLIB_MODULES)} stdlib modules, {len(paras)} paragraphs, "
         f"{sum(map(len, paras)) / 1e3:.0f}k characters, {len(data) / 1e3:.0f}k tokens "
         f"(BPE vocab {len(tok)}); training {steps} steps of {B} x {T} tokens, "
         f"{torch.get_num_threads()} threads")

    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg["seed"])
        model = LlamaForCausalLM(trained_model_config(len(tok), cfg))
        gen = torch.Generator().manual_seed(cfg["seed"])
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg["lr"], betas=(0.9, 0.95))
        model.train()
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, cfg["lr"], cfg["warmup"], cfg["min_lr_ratio"])
            starts = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
            window = torch.stack([data[s:s + T + 1] for s in starts.tolist()])
            logits = model(input_ids=window[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     window[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
            opt.step()
            losses.append(loss.item())
            if (step + 1) % log_every == 0 or step + 1 == steps:
                echo(f"  step {step + 1:>4}/{steps}  loss {losses[-1]:.3f}  "
                     f"({time.perf_counter() - started:.0f} s)")
    model.eval()
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    tail = losses[-10:]
    stamp = {"recipe": RECIPE, "steps": steps, "seed": cfg["seed"],
             "python": sys.version.split()[0], "paragraphs": len(paras),
             "characters": sum(map(len, paras)), "tokens": len(data), "vocab": len(tok),
             "parameters": sum(p.numel() for p in model.parameters()),
             "losses": [round(x, 4) for x in losses],
             "final_loss": round(sum(tail) / len(tail), 4) if tail else None,
             "seconds": round(time.perf_counter() - started, 1)}
    if steps:
        echo(f"trained in {stamp['seconds']:.0f} s: loss {losses[0]:.2f} -> "
             f"{stamp['final_loss']:.2f} (mean of the last {len(tail)} steps)")
    return stamp


def _train_in_subprocess(out_dir, steps, echo, overrides):
    """Run ``train_default_model`` in a child Python with OMP_WAIT_POLICY=PASSIVE.

    On a machine whose cores are shared with other busy processes, OpenMP's spinning threads
    make every small op wait for a descheduled partner thread (measured: 6 s per step instead of
    0.6 s); the passive policy must be set before torch loads, hence the child. Its progress
    lines are passed to ``echo``; the stamp dict comes back as the last line.
    """
    code = ("import json, sys; from gpu_sampler import tiny; "
            "a = json.loads(sys.argv[1]); "
            "s = tiny.train_default_model(a['out'], a['steps'], "
            "echo=lambda m: print(m, flush=True), **a['overrides']); "
            "print('STAMP ' + json.dumps(s), flush=True)")
    arg = json.dumps({"out": str(out_dir), "steps": steps, "overrides": overrides})
    pkg_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE",
               OMP_NUM_THREADS=str(torch.get_num_threads()),
               PYTHONPATH=os.pathsep.join([pkg_root] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    stamp = None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith("STAMP "):
            stamp = json.loads(line[6:])
        else:
            echo(line)
    err = proc.stderr.read()
    if proc.wait() != 0 or stamp is None:
        last = [ln for ln in err.splitlines() if ln.strip()][-1:] or ["no output"]
        raise RuntimeError(f"training the default model failed (exit {proc.returncode}): "
                           f"{last[0]}")
    return stamp


def default_steps():
    """``$GPU_SAMPLER_TINY_STEPS`` if set (0 = untrained random model), else ``TRAIN["steps"]``."""
    raw = os.environ.get(STEPS_ENV)
    if raw is None or raw.strip() == "":
        return TRAIN["steps"]
    try:
        steps = int(raw)
    except ValueError:
        raise ValueError(f"{STEPS_ENV} must be an integer >= 0, got {raw!r}") from None
    if steps < 0:
        raise ValueError(f"{STEPS_ENV} must be an integer >= 0, got {raw!r}")
    return steps


def read_stamp(path):
    """The JSON stamp of a model folder (``<path>/RECIPE``), or None when absent/unreadable."""
    try:
        return json.loads((Path(path) / RECIPE).read_text())
    except (OSError, ValueError):
        return None


def is_built(path, train_steps=None):
    """True when ``path`` holds a finished build of this RECIPE with ``train_steps`` steps."""
    path = Path(path)
    steps = default_steps() if train_steps is None else int(train_steps)
    stamp = read_stamp(path)
    return (path / "config.json").is_file() and (path / "tokenizer.json").is_file() and \
        isinstance(stamp, dict) and stamp.get("steps") == steps


def ensure_default_model(cache_dir=None, train_steps=None, echo=None, **overrides):
    """Build and save the default model + tokenizer if missing; return its folder.

    Args:
        cache_dir: parent folder (str or Path); default ``default_cache_dir()``.
        train_steps: None -> ``default_steps()`` (``TRAIN["steps"]`` unless
            ``$GPU_SAMPLER_TINY_STEPS`` says otherwise). 0 -> the untrained random-weight
            model and small tokenizer (about a second; what the tests use). N > 0 -> the
            stdlib-docstring model trained for N steps (the default takes about 2 minutes on two
            CPU cores). A cached folder built with another step count is rebuilt.
        echo: called with progress lines while training (default: print).
        overrides: ``TRAIN`` keys for the training run (tests shrink ``max_chars``).

    Returns:
        pathlib.Path of ``<cache_dir>/tiny-llama``, loadable with ``from_pretrained``; its
        ``RECIPE`` file holds the JSON stamp (steps, losses, final loss, seconds).

    Example:
        >>> p = ensure_default_model(train_steps=0)  # doctest: +SKIP
        >>> (p / "config.json").is_file()  # doctest: +SKIP
        True
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = root / "tiny-llama"
    steps = default_steps() if train_steps is None else int(train_steps)
    if steps < 0:
        raise ValueError(f"train_steps must be >= 0, got {steps}")
    if is_built(path, steps):
        return path
    if echo is None:
        def echo(line):
            print(line, flush=True)
    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp folder and rename: an interrupted build never leaves a
    # half-written folder that would later be taken for a complete one.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=root))
    try:
        if steps == 0:
            tok = build_tokenizer()
            model = build_model(len(tok))
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            stamp = {"recipe": RECIPE, "steps": 0, "losses": [], "final_loss": None}
        else:
            stamp = _train_in_subprocess(tmp, steps, echo, overrides)
        (tmp / RECIPE).write_text(json.dumps(stamp) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path
