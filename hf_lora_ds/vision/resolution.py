"""How many pixels an image keeps: one rule, applied before any processor sees the image.

A processor's own limit can be far above what a GPU holds (Qwen2.5-VL's default ``max_pixels`` turns a 12 MP phone
photo into 15,552 tokens), and families size images differently (fixed squares, tiles, native resolution). So the
run's bounds resize the image itself, keeping its aspect ratio, as LLaMA-Factory does: the dataset, the collator, the
audit, the planner and the eval all go through ``PixelBounds``, and count the same image tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PIL import Image

__all__ = ["DEFAULT_MAX_PIXELS", "DEFAULT_MIN_PIXELS", "PixelBounds"]

DEFAULT_MAX_PIXELS = 768 * 768  # LLaMA-Factory's image_max_pixels: ~750 Qwen-VL tokens an image
DEFAULT_MIN_PIXELS = 32 * 32


@dataclass(frozen=True)
class PixelBounds:
    """An image's pixel count held within ``[min_pixels, max_pixels]`` by scaling both sides alike."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    min_pixels: int = DEFAULT_MIN_PIXELS

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"image pixel bounds: need 0 < image_min_pixels <= image_max_pixels, got {self.min_pixels} and "
                f"{self.max_pixels}"
            )

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The ``(width, height)`` an image of this size is resized to (itself when within the bounds)."""
        pixels = width * height
        if self.min_pixels <= pixels <= self.max_pixels:
            return width, height
        scale = math.sqrt((self.max_pixels if pixels > self.max_pixels else self.min_pixels) / pixels)
        # Rounded down when shrinking, up when growing, so the result stays within the bound it was scaled to.
        rounding = math.floor if pixels > self.max_pixels else math.ceil
        return max(1, rounding(width * scale)), max(1, rounding(height * scale))

    def apply(self, image: Image.Image) -> Image.Image:
        """``image`` resized to ``size`` (the same object when already within the bounds)."""
        size = self.size(*image.size)
        return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)
