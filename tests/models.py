"""Tiny offline models and a tokenizer for tests, the demo and the CLI (no model hub needed).

Example::

    from tests.models import tiny_model, train_tokenizer
    model = tiny_model("llama", seed=0)            # random weights, ~0.2M parameters
    tok = train_tokenizer(1000)
    ids = tok(["hello world"], return_tensors="pt").input_ids
    model.generate(ids, max_new_tokens=5)
"""
import torch
from transformers.generation.streamers import BaseStreamer

from gpu_sampler.tiny import seeded_random_model
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

ARCHS = ("llama", "gpt2", "qwen2", "mistral")

_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A static key value cache is written in place at the current position.",
    "Sampling draws the next token from the processed distribution.",
    "Greedy decoding takes the most probable token at every step.",
    "Top-k keeps the k largest logits; top-p keeps the smallest nucleus above p.",
    "Hello world! Once upon a time there was a tiny language model.",
    "Repetition penalty divides positive logits and multiplies negative ones.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \"",
]


def tiny_config(arch, vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                intermediate_size=128, max_position_embeddings=512, **overrides):
    """A transformers config for `arch` in {"llama", "gpt2", "qwen2", "mistral"}.

    Token ids 0, 1, 2 are pad, bos, eos (as in `train_tokenizer`). Extra keyword arguments
    override config fields (e.g. ``sliding_window=16``).
    """
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if arch == "gpt2":
        kw = dict(vocab_size=vocab_size, n_embd=hidden_size, n_layer=num_layers, n_head=num_heads,
                  n_inner=intermediate_size, n_positions=max_position_embeddings,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    elif arch in ("llama", "qwen2", "mistral"):
        kw = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  intermediate_size=intermediate_size,
                  max_position_embeddings=max_position_embeddings, tie_word_embeddings=False)
        if arch == "mistral":
            # Mistral's default window (4096) is far larger than any test sequence.
            kw["sliding_window"] = 4096
    else:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    kw.update(special)
    kw.update(overrides)
    return AutoConfig.for_model(arch, **kw)


def tiny_model(arch, seed=0, vocab_size=1000, dtype=torch.float32, **config_kwargs):
    """A randomly initialised causal LM in eval mode (deterministic given `seed`).

    The model's generation_config carries only the special tokens, so generate() defaults are
    transformers' global ones.
    """
    config = tiny_config(arch, vocab_size=vocab_size, **config_kwargs)
    config._attn_implementation = "sdpa"
    return seeded_random_model(lambda: AutoModelForCausalLM.from_config(config, dtype=dtype),
                               seed, std=0.08)


def llama_20m(vocab_size=32000, dtype=torch.float32, seed=0):
    """A ~20M-parameter random Llama for benchmarks (hidden 256, 4 layers at vocab 32000)."""
    return tiny_model("llama", seed=seed, vocab_size=vocab_size, dtype=dtype, hidden_size=256,
                      num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=688,
                      max_position_embeddings=2048)


def train_tokenizer(vocab_size=1000):
    """A ByteLevel BPE tokenizer trained on a few sentences, as a PreTrainedTokenizerFast.

    Special tokens: <pad>=0, <s>=1, </s>=2; padding_side="left" (decoder-only batching).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_SENTENCES * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", padding_side="left")


def save_tiny(directory, arch="llama", seed=0, vocab_size=1000, **config_kwargs):
    """Save a tiny model + tokenizer folder loadable with AutoModelForCausalLM/AutoTokenizer.

    The model's vocab size is at least the tokenizer's. Returns `directory`.
    """
    tok = train_tokenizer(vocab_size)
    model = tiny_model(arch, seed=seed, vocab_size=max(vocab_size, len(tok)), **config_kwargs)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


class Recorder(BaseStreamer):
    """A streamer that records transformers' streamer calls (put tensors, then "end")."""

    def __init__(self):
        self.calls = []

    def put(self, value):
        self.calls.append(value.clone())

    def end(self):
        self.calls.append("end")


def left_padded(lengths, seed, vocab=1000):
    """Left-padded prompts of the given lengths, ids in [3, vocab), pads token 0: (ids, mask)."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, L - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[b, L - n:] = 1
    return ids, mask
