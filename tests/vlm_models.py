"""Tiny random vision-language models and synthetic image inputs for tests (offline).

Each builder returns ``(model, inputs)``: a model in eval mode with random weights from a tiny
config, and the keyword inputs ``model.generate`` takes (``input_ids``, ``attention_mask``,
``pixel_values``, ...) for a left-padded batch of two prompts, each holding one image's
placeholder tokens.
"""
import numpy as np
import torch

V = 128           # text vocabulary; the image token is V - 1
IMAGE = V - 1
_TEXT = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _image(seed, size):
    """A small random RGB image (PIL), as a processor takes it."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def _prompt(n_image, lengths, seed, before=2):
    """Left-padded ids [B, L] and mask: each row `before` text tokens, `n_image` image tokens,
    then the rest of its length in text tokens."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        row = torch.randint(3, IMAGE - 8, (n,), generator=g)
        row[before:before + n_image] = IMAGE
        ids[b, L - n:] = row
        mask[b, L - n:] = 1
    return ids, mask


def _eval(model, seed):
    model.eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    model.generation_config.bos_token_id = 1
    return model


def llava(seed=0, lengths=(9, 6)):
    """LLaVA: a tiny CLIP vision tower (image 16x16, patch 8: 4 patch tokens) and Llama."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, image_size=16, patch_size=8)
    cfg = LlavaConfig(vision_config=vision, text_config=LlamaConfig(**_TEXT),
                      image_token_id=IMAGE, vision_feature_layer=-1,
                      vision_feature_select_strategy="default", projector_hidden_act="gelu")
    torch.manual_seed(seed)
    model = _eval(LlavaForConditionalGeneration(cfg), seed)
    proc = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    images = [_image(seed + b, 20) for b in range(len(lengths))]
    pixel_values = proc(images, return_tensors="pt").pixel_values
    ids, mask = _prompt(4, lengths, seed)
    return model, dict(input_ids=ids, attention_mask=mask, pixel_values=pixel_values)
