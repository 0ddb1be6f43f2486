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
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, image_size=16, patch_size=8)
    cfg = LlavaConfig(vision_config=vision, text_config=LlamaConfig(**_TEXT),
                      image_token_id=IMAGE, vision_feature_layer=-1,
                      vision_feature_select_strategy="default", projector_hidden_act="gelu")
    torch.manual_seed(seed)
    model = _eval(LlavaForConditionalGeneration(cfg), seed)
    proc = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    images = [_image(seed + b, 20) for b in range(len(lengths))]
    pixel_values = proc(images, return_tensors="pt").pixel_values
    ids, mask = _prompt(4, lengths, seed)
    return model, dict(input_ids=ids, attention_mask=mask, pixel_values=pixel_values)


def _qwen_vl(kind, seed, lengths):
    """Qwen2-VL / Qwen2.5-VL: 56x56 images (4x4 patches of 14, merged 2x2: 4 image tokens),
    M-RoPE positions (mrope_section over head_dim 8), mm_token_type_ids marking the image."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)
    text = dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                        "mrope_section": [2, 1, 1]})
    vision = dict(depth=1, hidden_size=32, num_heads=4, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2)
    if kind == "qwen2_vl":
        from transformers import Qwen2VLConfig as Config
        from transformers import Qwen2VLForConditionalGeneration as Model
        vision.update(embed_dim=32, mlp_ratio=2)
    else:
        from transformers import Qwen2_5_VLConfig as Config
        from transformers import Qwen2_5_VLForConditionalGeneration as Model
        vision.update(intermediate_size=64, out_hidden_size=32, window_size=28,
                      fullatt_block_indexes=[0])
    cfg = Config(text_config=text, vision_config=vision, image_token_id=IMAGE,
                 video_token_id=IMAGE - 1, vision_start_token_id=IMAGE - 2,
                 vision_end_token_id=IMAGE - 3)
    torch.manual_seed(seed)
    model = _eval(Model(cfg), seed)
    proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=56 * 56)
    images = [_image(seed + b, 56) for b in range(len(lengths))]
    got = proc(images, return_tensors="pt")
    ids, mask = _prompt(4, lengths, seed)
    return model, dict(input_ids=ids, attention_mask=mask, pixel_values=got.pixel_values,
                       image_grid_thw=got.image_grid_thw,
                       mm_token_type_ids=(ids == IMAGE).to(torch.int32))


def qwen2_vl(seed=0, lengths=(9, 6)):
    return _qwen_vl("qwen2_vl", seed, lengths)


def qwen2_5_vl(seed=0, lengths=(9, 6)):
    return _qwen_vl("qwen2_5_vl", seed, lengths)


def _siglip(image_size, patch_size):
    from transformers import SiglipVisionConfig
    return SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, image_size=image_size,
                              patch_size=patch_size)


def _siglip_pixels(seed, n, size):
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    proc = SiglipImageProcessorPil(size={"height": size, "width": size})
    return proc([_image(seed + b, size + 4) for b in range(n)],
                return_tensors="pt").pixel_values


def gemma3(seed=0, lengths=(9, 6)):
    """Gemma 3 image-text: SigLIP 16x16 (4x4 patches pooled to 4 image tokens), a sliding and
    a full Gemma 3 layer; token_type_ids mark the image (bidirectional at the prefill)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig
    text = Gemma3TextConfig(**dict(_TEXT, head_dim=8), query_pre_attn_scalar=8,
                            sliding_window=8, layer_types=["sliding_attention",
                                                           "full_attention"])
    cfg = Gemma3Config(text_config=text, vision_config=_siglip(16, 4), mm_tokens_per_image=4,
                       image_token_index=IMAGE, boi_token_index=IMAGE - 2,
                       eoi_token_index=IMAGE - 3)
    torch.manual_seed(seed)
    model = _eval(Gemma3ForConditionalGeneration(cfg), seed)
    ids, mask = _prompt(4, lengths, seed)
    return model, dict(input_ids=ids, attention_mask=mask,
                       pixel_values=_siglip_pixels(seed, len(lengths), 16),
                       token_type_ids=(ids == IMAGE).long())


def paligemma(seed=0, lengths=(9, 6)):
    """PaliGemma: SigLIP 16x16 (patch 8: 4 image tokens) and Gemma; the image tokens lead the
    prompt, token_type_ids 0 over the prompt (the bidirectional prefix)."""
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration
    text = GemmaConfig(**dict(_TEXT, head_dim=8))
    cfg = PaliGemmaConfig(vision_config=_siglip(16, 8), text_config=text,
                          image_token_index=IMAGE, projection_dim=32, hidden_size=32,
                          vocab_size=V)
    torch.manual_seed(seed)
    model = _eval(PaliGemmaForConditionalGeneration(cfg), seed)
    ids, mask = _prompt(4, lengths, seed, before=0)
    return model, dict(input_ids=ids, attention_mask=mask,
                       pixel_values=_siglip_pixels(seed, len(lengths), 16),
                       token_type_ids=torch.zeros_like(ids))


def _idefics3(kind, seed, lengths):
    """Idefics3 / SmolVLM: a 16x16 vision tower (patch 4), pixel shuffle by 2 (4 image
    tokens), Llama; pixel_values [B, 1, 3, 16, 16] and pixel_attention_mask."""
    import transformers
    from transformers import LlamaConfig
    prefix = "Idefics3" if kind == "idefics3" else "SmolVLM"
    vision = getattr(transformers, f"{prefix}VisionConfig")(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        image_size=16, patch_size=4)
    cfg = getattr(transformers, f"{prefix}Config")(
        vision_config=vision, text_config=LlamaConfig(**_TEXT), image_token_id=IMAGE,
        scale_factor=2)
    torch.manual_seed(seed)
    model = _eval(getattr(transformers, f"{prefix}ForConditionalGeneration")(cfg), seed)
    ids, mask = _prompt(4, lengths, seed)
    pixels = _siglip_pixels(seed, len(lengths), 16)[:, None]
    return model, dict(input_ids=ids, attention_mask=mask, pixel_values=pixels,
                       pixel_attention_mask=torch.ones(len(lengths), 1, 16, 16,
                                                       dtype=torch.bool))


def idefics3(seed=0, lengths=(9, 6)):
    return _idefics3("idefics3", seed, lengths)


def smolvlm(seed=0, lengths=(9, 6)):
    return _idefics3("smolvlm", seed, lengths)
