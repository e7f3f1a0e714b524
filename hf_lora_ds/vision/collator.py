"""Batches of image samples: the text collator's batch, plus the pixels of the batch's images as the model takes them.

The dataset keeps each sample's images as references (``{"path", "bytes"}``), so pixels are made per batch, by the
processor's own image processor, never stored. What the processor writes per token besides the ids (Qwen-VL's
``mm_token_type_ids``, which its 3-D rotary positions read; Gemma 3's ``token_type_ids``, which let image tokens see
each other) is a function of the token id, learnt once from the processor (``TokenTypes``) and applied to the batch's
ids, padded, flattened or packed alike.
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

__all__ = ["IMAGES", "TokenTypes", "VisionCollator"]

IMAGES = "images"  # a sample's images, as the dataset keeps them: [{"path": ..., "bytes": ...}, ...]
_TEXT_KEYS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class TokenTypes:
    """Each per-token key the processor writes besides the ids, as ``{key: {token id: value}}`` for the ids whose
    value is not 0."""

    values: dict[str, dict[int, int]]

    @classmethod
    def of(cls, processor: ProcessorMixin, image_text: str) -> TokenTypes:
        """Read from the processor's output for one tiny image."""
        encoded = processor(text=[image_text + "x"], images=[Image.new("RGB", (32, 32))], return_tensors="pt")
        ids = encoded["input_ids"][0].tolist()
        values: dict[str, dict[int, int]] = {}
        for key, tensor in encoded.items():
            if key in _TEXT_KEYS or not isinstance(tensor, torch.Tensor) or tensor.shape != encoded["input_ids"].shape:
                continue
            values[key] = {token: int(value) for token, value in zip(ids, tensor[0].tolist()) if value}
        return cls(values)

    def of_ids(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-token keys for ``input_ids`` (0 wherever no image token stands)."""
        out = {}
        for key, table in self.values.items():
            tensor = torch.zeros_like(input_ids)
            for token, value in table.items():
                tensor[input_ids == token] = value
            out[key] = tensor
        return out


class VisionCollator:
    """``collator``'s batch of the samples' text, with the pixels of their images and the per-token keys."""

    def __init__(self, collator: Callable, encoding: ImageEncoding, rope_index: RopeIndex | None = None):
        self.collator, self.encoding, self.rope_index = collator, encoding, rope_index
        self.processor = encoding.processor
        self.token_types = TokenTypes.of(encoding.processor, encoding.image_text)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        images = [
            [self.encoding.load(ref, f"sample {i} image {j}") for j, ref in enumerate(feature.get(IMAGES) or [])]
            for i, feature in enumerate(features)
        ]
        batch = self.collator([{k: v for k, v in feature.items() if k != IMAGES} for feature in features])
        batch.update(self.token_types.of_ids(batch["input_ids"]))
        if any(images):
            nested = [sample for sample in images if sample]
            batch.update(self.processor.image_processor(images=nested, return_tensors="pt"))
        if self.rope_index is not None and "attention_mask" not in batch:  # packed or padding-free rows
            batch["position_ids"] = packed_rope_positions(
                self.rope_index,
                batch["input_ids"],
                batch["position_ids"],
                batch["mm_token_type_ids"],
                batch.get("image_grid_thw"),
            )
        return batch
