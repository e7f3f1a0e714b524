"""Tiny vision-language chat models built from their transformers configs, with no download.

Each family is built as its checkpoints are: the demo tokenizer (``data/tiny-qwen2-sum``) with the family's image and
turn tokens added as special tokens, a chat template of the family's real shape (``tiny_vlm_templates``), the
family's PIL image processor sized so a 64 x 64 image is 4 to ~40 image tokens, and a random model with hidden size
32, 2 text layers and a 2-layer vision tower. A build takes well under a second after the imports, and the same
``seed`` gives the same weights.

``VLM_FAMILIES`` are the families of issue 63; ``MORE_VLM_FAMILIES`` are built the same way for checks that reach
beyond them. Where torchvision is missing the processor has no video processor (``hf_lora_ds.vision.processor``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import (
    AutoModelForImageTextToText,
    AutoTokenizer,
    Gemma3Processor,
    Idefics3Processor,
    InternVLProcessor,
    LlavaNextProcessor,
    LlavaOnevisionProcessor,
    LlavaProcessor,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Qwen2_5_VLProcessor,
    Qwen2VLProcessor,
    Qwen3VLProcessor,
    SmolVLMProcessor,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import LlavaOnevisionImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

from hf_lora_ds._testing.tiny_vlm_templates import TEMPLATES
from hf_lora_ds.resources import DEMO_MODEL
from hf_lora_ds.vision.processor import make_processor, save_processor

__all__ = [
    "VLM_FAMILIES",
    "MORE_VLM_FAMILIES",
    "build_tiny_vlm",
    "save_tiny_vlm",
    "tiny_image",
]

VLM_FAMILIES = ("qwen2_5_vl", "qwen3_vl", "smolvlm", "gemma3", "llava_onevision", "internvl")
MORE_VLM_FAMILIES = ("idefics3", "llava", "qwen2_vl", "llava_next", "qwen3_vl_moe")


@dataclass(frozen=True)
class _Family:
    """How one family's tiny model is built: its tokenizer's tokens, processor and config."""

    processor_class: type[ProcessorMixin]
    image_processor: Callable[[], Any]
    config: Callable[[PreTrainedTokenizerBase], dict]  # the model config's fields, text and vision configs included
    eos: str  # the end-of-turn token generation stops at
    named_tokens: dict[str, str] = field(default_factory=dict)  # tokenizer attributes the processor reads
    turn_tokens: tuple[str, ...] = ()  # the template's other special tokens
    bos: str | None = None
    processor_kwargs: dict = field(default_factory=dict)


_HIDDEN = 32
_VISION = {"hidden_size": _HIDDEN, "intermediate_size": 2 * _HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2}
# SigLIP without the pooling head its VLMs never run, as their checkpoints have it.
_SIGLIP = {**_VISION, "model_type": "siglip_vision_model", "vision_use_head": False}
_CLIP = {**_VISION, "model_type": "clip_vision_model", "projection_dim": _HIDDEN}


def _text(tokenizer: PreTrainedTokenizerBase, **fields: Any) -> dict:
    """A 2-layer text config of hidden 32 sized for ``tokenizer``, its special ids inside the vocabulary."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": _HIDDEN,
        "intermediate_size": 2 * _HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **fields,
    }


def _qwen2_vl_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """Qwen2-VL / Qwen2.5-VL: 14-pixel patches merged 2 x 2 (a 64 x 64 image is resized to 56 x 56: 4 tokens); the
    rotary frequencies of a head of 8 (4) split over time, height and width."""
    return {
        "text_config": _text(tokenizer, rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]}),
        "vision_config": {
            "depth": 2,
            "hidden_size": _HIDDEN,
            "embed_dim": _HIDDEN,  # Qwen2-VL's name for the tower's width
            "intermediate_size": 2 * _HIDDEN,
            "num_heads": 2,
            "out_hidden_size": _HIDDEN,
            "fullatt_block_indexes": [1],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        **_qwen_token_ids(tokenizer),
    }


_MROPE = [2, 1, 1]  # Qwen3-VL's rotary frequencies (head 8: 4) split over time, height and width


def _qwen3_vl_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """Qwen3-VL: 16-pixel patches merged 2 x 2 (a 64 x 64 image is 4 tokens), one deepstack merger."""
    return {
        "text_config": _text(tokenizer, head_dim=8, rope_parameters={"rope_type": "default", "mrope_section": _MROPE}),
        "vision_config": {
            "depth": 2,
            "hidden_size": _HIDDEN,
            "intermediate_size": 2 * _HIDDEN,
            "num_heads": 2,
            "out_hidden_size": _HIDDEN,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        **_qwen_token_ids(tokenizer),
    }


def _qwen3_vl_moe_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """Qwen3-VL with 4 experts, 2 a token, in each text layer."""
    fields = _qwen3_vl_config(tokenizer)
    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": _HIDDEN // 2}
    return {**fields, "text_config": {**fields["text_config"], **experts}}


def _qwen_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict:
    return {
        "image_token_id": tokenizer.image_token_id,
        "video_token_id": tokenizer.video_token_id,
        "vision_start_token_id": tokenizer.vision_start_token_id,
        "vision_end_token_id": tokenizer.vision_end_token_id,
    }


def _idefics_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """SmolVLM / Idefics3: a 64 x 64 image in 8-pixel patches (64), pixel-shuffled by 2: 16 tokens, no splitting."""
    return {
        "text_config": _text(tokenizer, model_type="llama"),
        "vision_config": {**_VISION, "image_size": 64, "patch_size": 8},
        "scale_factor": 2,
        "image_token_id": tokenizer.convert_tokens_to_ids("<image>"),
    }


def _idefics_image_processor(cls: type) -> Callable[[], Any]:
    return lambda: cls(
        do_image_splitting=False, size={"longest_edge": 64}, max_image_size={"longest_edge": 64}, do_pad=True
    )


def _gemma3_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """Gemma 3: a 64 x 64 SigLIP image in 8-pixel patches, pooled to 16 soft tokens."""
    return {
        "text_config": _text(
            tokenizer,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "vision_config": {**_SIGLIP, "image_size": 64, "patch_size": 8},
        "mm_tokens_per_image": 16,
        "boi_token_index": tokenizer.boi_token_id,
        "eoi_token_index": tokenizer.eoi_token_id,
        "image_token_index": tokenizer.image_token_id,
    }


# LLaVA-OneVision / LLaVA-NeXT: 32 x 32 crops in 8-pixel patches (16 features each), any-resolution grids up to 2 x 1.
_PINPOINTS = [[32, 32], [32, 64], [64, 32]]


def _llava_next_config(tokenizer: PreTrainedTokenizerBase, vision: dict, **fields: Any) -> dict:
    return {
        "text_config": _text(tokenizer, model_type="qwen2"),
        "vision_config": {**vision, "image_size": 32, "patch_size": 8},
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "image_grid_pinpoints": _PINPOINTS,
        **fields,
    }


def _internvl_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """InternVL: a 64 x 64 image (no crops) in 8-pixel patches, pixel-shuffled by 2: 16 tokens."""
    return {
        "text_config": _text(tokenizer, model_type="qwen2"),
        "vision_config": {**_VISION, "image_size": [64, 64], "patch_size": [8, 8]},
        "image_token_id": tokenizer.context_image_token_id,
        "image_seq_length": 16,
        "downsample_ratio": 0.5,
    }


def _llava_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    """LLaVA-1.5: a 32 x 32 CLIP image in 8-pixel patches, the class token dropped: 16 tokens."""
    return {
        "text_config": _text(tokenizer, model_type="llama"),
        "vision_config": {**_CLIP, "image_size": 32, "patch_size": 8},
        "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
        "image_seq_length": 16,
        "vision_feature_layer": -1,
    }


# A CLIP tower's features: one per 8-pixel patch, the class token dropped ("default").
_CLIP_PROCESSOR = {"patch_size": 8, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
_QWEN_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
_CHATML_TURNS = ("<|im_start|>", "<|im_end|>")
_IDEFICS_TOKENS = ("<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>")
# A 64 x 64 image stays 64 x 64 (an image's pixel count is clamped to 28*28 .. 64*64 and rounded to the patches).
_QWEN_PIXELS = {"min_pixels": 28 * 28, "max_pixels": 64 * 64, "merge_size": 2, "temporal_patch_size": 2}


def _qwen_family(processor_class: type[ProcessorMixin], patch_size: int, config: Callable) -> _Family:
    """A Qwen-VL family: ChatML turns, its vision tokens, the PIL image processor at ``patch_size``."""
    return _Family(
        processor_class,
        lambda: Qwen2VLImageProcessorPil(patch_size=patch_size, **_QWEN_PIXELS),
        config,
        eos="<|im_end|>",
        named_tokens=_QWEN_TOKENS,
        turn_tokens=_CHATML_TURNS,
    )


_FAMILIES: dict[str, _Family] = {
    "qwen2_5_vl": _qwen_family(Qwen2_5_VLProcessor, 14, _qwen2_vl_config),
    "qwen2_vl": _qwen_family(Qwen2VLProcessor, 14, _qwen2_vl_config),
    "qwen3_vl": _qwen_family(Qwen3VLProcessor, 16, _qwen3_vl_config),
    "qwen3_vl_moe": _qwen_family(Qwen3VLProcessor, 16, _qwen3_vl_moe_config),
    "smolvlm": _Family(
        SmolVLMProcessor,
        _idefics_image_processor(SmolVLMImageProcessorPil),
        _idefics_config,
        eos="<end_of_utterance>",
        turn_tokens=("<|im_start|>", *_IDEFICS_TOKENS, "<video>"),
        bos="<|im_start|>",
        processor_kwargs={"image_seq_len": 16},
    ),
    "idefics3": _Family(
        Idefics3Processor,
        _idefics_image_processor(Idefics3ImageProcessorPil),
        _idefics_config,
        eos="<end_of_utterance>",
        turn_tokens=("<|begin_of_text|>", *_IDEFICS_TOKENS),
        bos="<|begin_of_text|>",
        processor_kwargs={"image_seq_len": 16},
    ),
    "gemma3": _Family(
        Gemma3Processor,
        lambda: Gemma3ImageProcessorPil(size={"height": 64, "width": 64}, do_pan_and_scan=False),
        _gemma3_config,
        eos="<end_of_turn>",
        named_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        turn_tokens=("<start_of_turn>", "<end_of_turn>"),
        bos="<bos>",
        processor_kwargs={"image_seq_length": 16},
    ),
    "llava_onevision": _Family(
        LlavaOnevisionProcessor,
        lambda: LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=_PINPOINTS),
        lambda tokenizer: _llava_next_config(
            tokenizer,
            _SIGLIP,
            video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
            vision_feature_select_strategy="full",
        ),
        eos="<|im_end|>",
        turn_tokens=(*_CHATML_TURNS, "<image>", "<video>"),
        processor_kwargs={"num_image_tokens": 16, "vision_feature_select_strategy": "full"},
    ),
    "llava_next": _Family(
        LlavaNextProcessor,
        lambda: LlavaNextImageProcessorPil(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_grid_pinpoints=_PINPOINTS
        ),
        lambda tokenizer: _llava_next_config(
            tokenizer, _CLIP, vision_feature_select_strategy="default", vision_feature_layer=-1
        ),
        eos="<|im_end|>",
        turn_tokens=(*_CHATML_TURNS, "<image>"),
        processor_kwargs=_CLIP_PROCESSOR,
    ),
    "internvl": _Family(
        InternVLProcessor,
        lambda: GotOcr2ImageProcessorPil(size={"height": 64, "width": 64}, crop_to_patches=False),
        _internvl_config,
        eos="<|im_end|>",
        named_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
        turn_tokens=_CHATML_TURNS,
        processor_kwargs={"image_seq_length": 16},
    ),
    "llava": _Family(
        LlavaProcessor,
        lambda: CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        _llava_config,
        eos="</s>",
        turn_tokens=("<s>", "</s>", "<image>"),
        bos="<s>",
        processor_kwargs=_CLIP_PROCESSOR,
    ),
}


def _tokenizer(family: str, spec: _Family) -> PreTrainedTokenizerBase:
    """The demo tokenizer with the family's image and turn tokens as special tokens, its template and its BOS/EOS."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL, extra_special_tokens=dict(spec.named_tokens))
    tokens = {"eos_token": spec.eos, "extra_special_tokens": list(spec.turn_tokens)}
    if spec.bos:
        tokens["bos_token"] = spec.bos
    tokenizer.add_special_tokens(tokens, replace_extra_special_tokens=False)
    tokenizer.chat_template = TEMPLATES[family]
    return tokenizer


def _config(family: str, tokenizer: PreTrainedTokenizerBase, fields: dict) -> PreTrainedConfig:
    """The family's config from ``fields``, its special ids those of ``tokenizer``."""
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return CONFIG_MAPPING[family](**fields, pad_token_id=tokenizer.pad_token_id, **ids)


def build_tiny_vlm(family: str, seed: int = 0) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A randomly initialised ``family`` model (a transformers ``model_type`` of ``VLM_FAMILIES`` or
    ``MORE_VLM_FAMILIES``) and its processor; deterministic for a given ``seed``."""
    if family not in _FAMILIES:
        raise ValueError(f"no tiny {family!r} model; families: {', '.join(VLM_FAMILIES + MORE_VLM_FAMILIES)}")
    spec = _FAMILIES[family]
    tokenizer = _tokenizer(family, spec)
    processor = make_processor(
        spec.processor_class, spec.image_processor(), tokenizer, TEMPLATES[family], **spec.processor_kwargs
    )
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(_config(family, tokenizer, spec.config(tokenizer)))
    _randomize_zero_weights(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model, processor


def _randomize_zero_weights(model: PreTrainedModel) -> None:
    """Random values for the weight matrices a fresh model starts at zero, as a trained checkpoint has them: Gemma 3's
    zero projection would hide every image from the language model (and the tower from any gradient), InternVL's zero
    position embeddings would hide where a patch is; with the tower and projector frozen, nothing would learn them."""
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2 and not param.any():
                param.normal_(std=0.02)


def save_tiny_vlm(family: str, out_dir: str | Path, seed: int = 0) -> Path:
    """``build_tiny_vlm(family, seed)`` saved as a checkpoint (model, tokenizer, image processor, chat template) in
    ``out_dir``, which ``hf_lora_ds.vision.processor.load_processor`` and ``AutoModelForImageTextToText`` reload."""
    out_dir = Path(out_dir)
    model, processor = build_tiny_vlm(family, seed)
    model.save_pretrained(out_dir)
    save_processor(processor, out_dir)
    return out_dir


def tiny_image(seed: int = 0, size: int = 64) -> Image.Image:
    """A deterministic random RGB image of ``size`` x ``size`` pixels."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size, size, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")
