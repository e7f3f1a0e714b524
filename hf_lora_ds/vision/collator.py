"""Batches of image samples: the text collator's batch, plus the pixels of the batch's images as the model takes them.

The dataset keeps each sample's images as references (``{"path", "bytes"}``), so pixels are made per batch, by the
processor's own image processor, never stored. What the processor writes per token besides the ids (Qwen-VL's
``mm_token_type_ids``, which its 3-D rotary positions read; Gemma 3's ``token_type_ids``, which let image tokens see
each other) is a function of the token id, learnt once from the processor (``ProcessorOutputs``) and applied to the
batch's ids, padded, flattened or packed alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from transformers import ProcessorMixin

from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.packing import RopeIndex, packed_rope_positions

__all__ = ["IMAGES", "ProcessorOutputs", "VisionCollator"]

IMAGES = "images"  # a sample's images, as the dataset keeps them: [{"path": ..., "bytes": ...}, ...]
_TEXT_KEYS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class ProcessorOutputs:
    """What the processor's output holds besides the ids, read once from its output for one tiny image: the per-token
    keys, as ``{key: {token id: value}}`` for the ids whose value is not 0, the keys of the images' own tensors, and
    the image processor's arguments as the processor passes them (InternVL's ``crop_to_patches``, SmolVLM's
    row/column info)."""

    token_types: dict[str, dict[int, int]]
    pixel_keys: tuple[str, ...]
    image_kwargs: dict[str, Any]

    @classmethod
    def of(cls, processor: ProcessorMixin, image_text: str) -> ProcessorOutputs:
        encoded = processor(text=[image_text + "x"], images=[[Image.new("RGB", (32, 32))]], return_tensors="pt")
        ids = encoded["input_ids"]
        token_types, pixel_keys = {}, []
        for key, tensor in encoded.items():
            if key in _TEXT_KEYS:
                continue
            if isinstance(tensor, torch.Tensor) and tensor.shape == ids.shape:
                token_types[key] = {t: int(v) for t, v in zip(ids[0].tolist(), tensor[0].tolist()) if v}
            else:
                pixel_keys.append(key)
        image_kwargs = processor._merge_kwargs(tokenizer_init_kwargs=processor.tokenizer.init_kwargs)["images_kwargs"]
        return cls(token_types, tuple(pixel_keys), image_kwargs)

    def of_ids(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-token keys for ``input_ids`` (0 wherever no image token stands)."""
        out = {}
        for key, table in self.token_types.items():
            tensor = torch.zeros_like(input_ids)
            for token, value in table.items():
                tensor[input_ids == token] = value
            out[key] = tensor
        return out

    def pixels(self, processor: ProcessorMixin, images: list[list[Image.Image]]) -> dict[str, torch.Tensor]:
        """The images' tensors as the processor's own call makes them, one list of images per sample that has any."""
        made = processor.image_processor(images=images, **{**self.image_kwargs, "return_tensors": "pt"})
        return {key: made[key] for key in self.pixel_keys if key in made}


class VisionCollator:
    """``collator``'s batch of the samples' text, with the pixels of their images and the per-token keys."""

    def __init__(self, collator: Callable, encoding: ImageEncoding, rope_index: RopeIndex | None = None):
        self.collator, self.encoding, self.rope_index = collator, encoding, rope_index
        self.processor = encoding.processor
        self.outputs = ProcessorOutputs.of(encoding.processor, encoding.image_text)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        images = [
            [self.encoding.load(ref, f"sample {i} image {j}") for j, ref in enumerate(feature.get(IMAGES) or [])]
            for i, feature in enumerate(features)
        ]
        batch = self.collator([{k: v for k, v in feature.items() if k != IMAGES} for feature in features])
        batch.update(self.outputs.of_ids(batch["input_ids"]))
        if any(images):
            batch.update(self.outputs.pixels(self.processor, [sample for sample in images if sample]))
        if self.rope_index is not None and "attention_mask" not in batch:  # packed or padding-free rows
            batch["position_ids"] = packed_rope_positions(
                self.rope_index,
                batch["input_ids"],
                batch["position_ids"],
                batch["mm_token_type_ids"],
                batch.get("image_grid_thw"),
            )
        return batch
