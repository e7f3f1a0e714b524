"""Pixel bounds: an image scaled into [min_pixels, max_pixels] keeping its aspect ratio, once, before any processor."""

from __future__ import annotations

import pytest
from PIL import Image

from hf_lora_ds.vision.resolution import DEFAULT_MAX_PIXELS, PixelBounds


@pytest.mark.parametrize("size", [(4032, 3024), (3024, 4032), (10_000, 300), (1920, 1080)])
def test_a_photo_is_scaled_down_within_the_bound_keeping_its_aspect(size):
    width, height = PixelBounds().size(*size)
    assert width * height <= DEFAULT_MAX_PIXELS
    assert width * height > 0.98 * DEFAULT_MAX_PIXELS  # not shrunk further than the bound asks
    assert abs(width / height - size[0] / size[1]) < 0.02 * size[0] / size[1]


def test_a_tiny_image_is_scaled_up_and_an_image_within_the_bounds_is_left_as_it_is():
    bounds = PixelBounds(max_pixels=64 * 64, min_pixels=32 * 32)
    width, height = bounds.size(8, 16)
    assert width * height >= 32 * 32 and width / height == pytest.approx(0.5, rel=0.05)
    image = Image.new("RGB", (40, 40))
    assert bounds.apply(image) is image
    assert bounds.apply(Image.new("RGB", (400, 100))).size == bounds.size(400, 100)


def test_inconsistent_bounds_are_refused():
    with pytest.raises(ValueError, match="image_min_pixels <= image_max_pixels"):
        PixelBounds(max_pixels=100, min_pixels=200)
