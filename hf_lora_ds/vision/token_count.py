"""How many tokens the processor gives an image of a given size, without the image's pixels.

A planner sizes activation memory from the images' token counts, and the sizes come from the files' headers
(``hf_lora_ds.vision.images.image_size``), so decoding every image to run the processor on it would be the slow part
of a plan. The count is the processor's own rule instead: ``_get_num_multimodal_tokens`` (the arithmetic vLLM uses,
on every processor that has one), applied to the size the run's ``PixelBounds`` leave.

That rule counts what its family calls the image's tokens, which is not always every token the expansion writes:
Qwen-VL and Gemma 3 count the placeholders but not the start/end markers around them. Those markers are a fixed
number an image, so the difference is read once, from one blank image of a reference size run through the processor
(``ImageTokens.of``), and added to each count. A processor without the rule (SmolVLM's) is run on a blank image of
each size asked: its pixels are the processor's work, never the user's image decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image
from transformers import ProcessorMixin

from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = ["ImageTokens", "image_tokens"]

_REFERENCE = (64, 64)  # the blank image the rule's difference from the expansion is read on: small, so cheap


@dataclass
class ImageTokens:
    """The image tokens of one processor within one run's bounds, per image size; built by ``of``."""

    encoding: ImageEncoding
    markers: int | None  # the tokens an image holds beyond the processor rule's count; None: no rule, run it
    _counts: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, encoding: ImageEncoding) -> ImageTokens:
        """Read the processor's rule and, where it has one, how far its count is from a real expansion's."""
        rule = _rule(encoding.processor, *_REFERENCE)
        markers = None if rule is None else _expanded(encoding, *_REFERENCE) - rule
        return cls(encoding, markers)

    def __call__(self, width: int, height: int) -> int:
        """The tokens the processor writes for an image of ``width`` x ``height`` pixels, once the bounds resized it."""
        size = self.encoding.bounds.size(width, height)
        if size not in self._counts:
            rule = None if self.markers is None else _rule(self.encoding.processor, *size)
            self._counts[size] = _expanded(self.encoding, *size) if rule is None else rule + self.markers
        return self._counts[size]


def image_tokens(processor: ProcessorMixin, width: int, height: int, bounds: PixelBounds | None = None) -> int:
    """The tokens ``processor`` writes for one image of ``width`` x ``height`` pixels resized to ``bounds`` (the
    run's; the default bounds when None). Counting many images, build ``ImageTokens`` once instead."""
    return ImageTokens.of(ImageEncoding.of(processor, bounds))(width, height)


def _rule(processor: ProcessorMixin, width: int, height: int) -> int | None:
    """The processor's own count for an image of this size, None where it has no such rule."""
    try:
        counted = processor._get_num_multimodal_tokens(image_sizes=[(height, width)])
    except (AttributeError, NotImplementedError):
        return None
    tokens = getattr(counted, "num_image_tokens", None)
    return None if not tokens else int(tokens[0])


def _expanded(encoding: ImageEncoding, width: int, height: int) -> int:
    """The image tokens of a real expansion of one blank image of this size (already within the bounds)."""
    blank = Image.new("RGB", (width, height))
    ids = encoding.processor(text=[encoding.image_text], images=[[blank]])["input_ids"][0]
    return int(np.isin(ids, encoding.image_ids).sum())
