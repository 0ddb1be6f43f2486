"""The embedded default model: a tiny random-weight Llama and a BPE tokenizer, built offline.

No model hub is needed. ``ensure_default_model()`` builds the folder once, then everything loads
it the ordinary way (``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``),
so the demo and the CLI exercise the same loading path as a real checkpoint.

Example:
    >>> from gpu_sampler import tiny
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> path = tiny.ensure_default_model()
    >>> model = AutoModelForCausalLM.from_pretrained(path)
    >>> tok = AutoTokenizer.from_pretrained(path)
    >>> ids = tok(["The quick brown fox"], return_tensors="pt").input_ids
    >>> model.generate(ids, max_new_tokens=4, do_sample=False).shape[0]
    1
"""
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Bump when the recipe changes, so that an old cached folder is rebuilt rather than reused.
RECIPE = "tiny-llama-v1"
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
TOKENIZER_VOCAB = 2000

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


def build_tokenizer(vocab_size=TOKENIZER_VOCAB):
    """A ByteLevel BPE tokenizer trained on ``CORPUS``, as a left-padding PreTrainedTokenizerFast.

    Special tokens: ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2. The trained vocabulary is smaller
    than ``vocab_size`` when the corpus runs out of merges (about 1000 entries here).

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
    bpe.train_from_iterator(CORPUS, trainer=trainer)
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


def _complete(path):
    return (path / "config.json").is_file() and (path / "tokenizer.json").is_file() and \
        (path / RECIPE).is_file()


def ensure_default_model(cache_dir=None):
    """Build and save the default tiny model + tokenizer if missing; return its folder.

    Args:
        cache_dir: parent folder (str or Path); default ``default_cache_dir()``.

    Returns:
        pathlib.Path of ``<cache_dir>/tiny-llama``, loadable with ``from_pretrained``.

    Example:
        >>> p = ensure_default_model()
        >>> (p / "config.json").is_file()
        True
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = root / "tiny-llama"
    if _complete(path):
        return path
    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp folder and rename: an interrupted build never leaves a
    # half-written folder that would later be taken for a complete one.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=root))
    try:
        tok = build_tokenizer()
        model = build_model(len(tok))
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / RECIPE).write_text("built by gpu_sampler.tiny\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path
