"""What the package knows of each vision-language family: the tokens of an image, and where its parts are.

A family's image is more than its placeholder: Qwen-VL wraps it in ``<|vision_start|>``/``<|vision_end|>``, Gemma 3 in
``<start_of_image>``/``<end_of_image>`` around its soft tokens, InternVL in ``<img>``/``</img>``, SmolVLM and Idefics3
in ``<fake_token_around_image>`` with a ``<global-img>`` and ``<row_i_col_j>`` tokens. None of them may ever be a
label: ``VisionFamily.image_token_ids`` reads them from the processor (and its tokenizer) as a checkpoint names them,
with the family's usual spellings where it names none.

The vision tower, the projector and the language model are attributes of the inner model (``model.model`` of a
``...ForConditionalGeneration``), as transformers 5 lays them out:

=================  =========================  ============================================  ===============
model_type         tower                      projector                                     language model
=================  =========================  ============================================  ===============
qwen2_vl           visual                     visual.merger                                 language_model
qwen2_5_vl         visual                     visual.merger                                 language_model
qwen3_vl(_moe)     visual                     visual.merger, visual.deepstack_merger_list   language_model
smolvlm, idefics3  vision_model               connector                                     text_model
gemma3, llava,     vision_tower               multi_modal_projector                         language_model
llava_next,
llava_onevision,
internvl
=================  =========================  ============================================  ===============

Qwen-VL's mergers live inside its tower: a projector path inside the tower path belongs to the projector.
LLaVA-NeXT and LLaVA-OneVision also learn ``image_newline``, a parameter of the inner model itself that the projector's
output rows end with (``projector_parameters``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedConfig, ProcessorMixin

__all__ = ["VisionFamily", "VISION_FAMILIES", "family_of"]

# SmolVLM's and Idefics3's tile markers: <row_1_col_1> ... (one per tile of a split image).
_TILE_TOKEN = re.compile(r"<row_\d+_col_\d+>")


@dataclass(frozen=True)
class VisionFamily:
    """One family's facts. Paths are attributes of the inner model (``model.model``), dotted."""

    model_type: str
    # Processor and tokenizer attributes that name an image's tokens (placeholder, start/end, soft tokens, video).
    token_attributes: tuple[str, ...]
    # The family's usual spellings of those tokens, for checkpoints whose processor does not name them all.
    image_tokens: tuple[str, ...]
    tower: str
    projector: tuple[str, ...]
    language_model: str = "language_model"
    projector_parameters: tuple[str, ...] = ()
    # Whether packed samples can get exactly their unpacked positions: Qwen-VL's 3-D rotary positions come from the
    # model's own rope index, computed per sample.
    packs_exactly: bool = False
    tile_tokens: bool = False  # whether <row_i_col_j> tokens mark the tiles of a split image

    def image_token_ids(self, processor: ProcessorMixin) -> frozenset[int]:
        """The ids of every token that belongs to an image in ``processor``'s vocabulary: never a label."""
        tokenizer = processor.tokenizer
        named = {
            getattr(owner, attribute, None) for owner in (processor, tokenizer) for attribute in self.token_attributes
        }
        tokens = {token for token in named | set(self.image_tokens) if isinstance(token, str)}
        vocabulary = tokenizer.get_vocab()
        if self.tile_tokens:
            tokens |= {token for token in vocabulary if _TILE_TOKEN.fullmatch(token)}
        return frozenset(vocabulary[token] for token in tokens if token in vocabulary)


_QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_QWEN_ATTRIBUTES = ("image_token", "video_token", "vision_start_token", "vision_end_token")
_IDEFICS_ATTRIBUTES = ("image_token", "fake_image_token", "global_image_token", "global_image_tag", "video_token")
_IDEFICS_TOKENS = ("<image>", "<fake_token_around_image>", "<global-img>")
_LLAVA = {"tower": "vision_tower", "projector": ("multi_modal_projector",)}
_LLAVA_TOKENS = {"token_attributes": ("image_token", "video_token"), "image_tokens": ("<image>", "<video>")}


def _qwen(model_type: str, projector: tuple[str, ...] = ("visual.merger",)) -> VisionFamily:
    return VisionFamily(
        model_type, _QWEN_ATTRIBUTES, _QWEN_TOKENS, tower="visual", projector=projector, packs_exactly=True
    )


def _idefics(model_type: str) -> VisionFamily:
    return VisionFamily(
        model_type,
        _IDEFICS_ATTRIBUTES,
        _IDEFICS_TOKENS,
        tower="vision_model",
        projector=("connector",),
        language_model="text_model",
        tile_tokens=True,
    )


_QWEN3_PROJECTOR = ("visual.merger", "visual.deepstack_merger_list")
VISION_FAMILIES: dict[str, VisionFamily] = {
    family.model_type: family
    for family in (
        _qwen("qwen2_vl"),
        _qwen("qwen2_5_vl"),
        _qwen("qwen3_vl", _QWEN3_PROJECTOR),
        _qwen("qwen3_vl_moe", _QWEN3_PROJECTOR),
        _idefics("smolvlm"),
        _idefics("idefics3"),
        VisionFamily(
            "gemma3",
            ("image_token", "boi_token", "eoi_token"),
            ("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
            **_LLAVA,
        ),
        VisionFamily(
            "internvl",
            ("image_token", "context_image_token", "start_image_token", "end_image_token", "video_token"),
            ("<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
            **_LLAVA,
        ),
        VisionFamily("llava", **_LLAVA_TOKENS, **_LLAVA),
        VisionFamily("llava_next", **_LLAVA_TOKENS, **_LLAVA, projector_parameters=("image_newline",)),
        VisionFamily("llava_onevision", **_LLAVA_TOKENS, **_LLAVA, projector_parameters=("image_newline",)),
    )
}


def family_of(model_or_config: Any) -> VisionFamily | None:
    """The vision family of a model (also one wrapped by PEFT) or config, or None for a text-only model."""
    config = model_or_config if isinstance(model_or_config, PreTrainedConfig) else model_or_config.config
    return VISION_FAMILIES.get(config.model_type)
