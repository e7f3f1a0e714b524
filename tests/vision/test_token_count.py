"""Image tokens counted without the image: for every tiny family and sizes within, above and below the run's bounds,
the count equals the image tokens of the processor's real expansion of a noisy image of that size, resized by the
bounds as the dataset resizes it."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm
from hf_lora_ds.vision import token_count
from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.resolution import PixelBounds
from hf_lora_ds.vision.token_count import ImageTokens, image_tokens

BOUNDS = PixelBounds(max_pixels=36 * 36, min_pixels=16 * 16)  # below the tiny Qwen processors' own 64 * 64
# (width, height): within the bounds, above them (resized down), wide and above, below them (resized up).
SIZES = [(30, 40), (64, 64), (200, 120), (12, 20)]


def real_count(encoding: ImageEncoding, width: int, height: int) -> int:
    noise = np.random.default_rng(width * height).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = BOUNDS.apply(Image.fromarray(noise))
    ids = encoding.processor(text=[encoding.image_text], images=[[image]])["input_ids"][0]
    return int(np.isin(ids, encoding.image_ids).sum())


@pytest.mark.parametrize("family", VLM_FAMILIES + MORE_VLM_FAMILIES)
def test_count_is_the_real_expansion(family):
    _, processor = build_tiny_vlm(family)
    encoding = ImageEncoding.of(processor, BOUNDS)
    count = ImageTokens.of(encoding)
    real = [real_count(encoding, *size) for size in SIZES]
    assert [count(*size) for size in SIZES] == real
    assert image_tokens(processor, *SIZES[2], BOUNDS) == real[2]


@pytest.mark.parametrize(("family", "markers"), [("qwen2_5_vl", 2), ("gemma3", 2), ("internvl", 0), ("smolvlm", None)])
def test_markers_beyond_the_rule(family, markers):
    """Qwen-VL's and Gemma 3's rules count placeholders, not the start/end around them; SmolVLM has no rule."""
    _, processor = build_tiny_vlm(family)
    assert ImageTokens.of(ImageEncoding.of(processor, BOUNDS)).markers == markers


def test_a_processor_with_a_rule_runs_no_image(monkeypatch):
    """Past the one reference image, the count is arithmetic: no image of the asked size goes through the processor."""
    _, processor = build_tiny_vlm("qwen2_5_vl")
    encoding = ImageEncoding.of(processor, BOUNDS)
    count = ImageTokens.of(encoding)
    real = [real_count(encoding, *size) for size in SIZES]
    monkeypatch.setattr(token_count, "_expanded", lambda *args: pytest.fail("an image ran through the processor"))
    assert [count(*size) for size in SIZES] == real
