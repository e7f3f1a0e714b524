"""A vision-language model's training FLOPs as the throughput callback counts them (the language model per token,
image tokens included; the tower and projector per image, as they ran) against torch's FlopCounterMode over a real
training step."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from torch.utils.flop_counter import FlopCounterMode

from hf_lora_ds._testing.tiny_vlms import VLM_FAMILIES, build_tiny_vlm, tiny_image
from hf_lora_ds.callbacks.throughput import flops_per_token, flops_shape
from hf_lora_ds.callbacks.vision_flops import VisionFlops
from hf_lora_ds.config.vision import VisionTraining
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.modules import vision_parts


def _step_batch(processor) -> dict:
    """Two chats, an image each, of different sizes (a native-resolution tower sees different patch counts)."""
    image_text = ImageEncoding.of(processor).image_text
    texts = [f"{image_text}which colour? red", f"{image_text}how many dots? three dots here"]
    images = [[tiny_image(0, 64)], [tiny_image(1, 64).resize((64, 48))]]
    return dict(processor(text=texts, images=images, return_tensors="pt", padding=True))


def _counted_and_measured(family: str, train_projector: bool = False) -> tuple[float, float, int, int]:
    """(the callback's FLOPs of one step, FlopCounterMode's, the vision hooks' part, FlopCounterMode's for the tower
    and projector modules)."""
    torch.manual_seed(0)
    model, processor = build_tiny_vlm(family)
    model.set_attn_implementation("eager")  # attention as matmuls FlopCounterMode sees
    training = VisionTraining("off", "full" if train_projector else "off")
    model = wrap_with_lora(model, LoraConfig(r=4, target_modules="all-linear"), training)
    batch = _step_batch(processor)
    vision = VisionFlops(model)
    model.train()
    with FlopCounterMode(display=False, depth=None) as counter:
        model(**batch, labels=batch["input_ids"]).loss.backward()
    tokens = batch["input_ids"].numel()  # no padding counted as a real token matters here: rows are equal or padded
    tower = vision.take()
    counted = tokens * flops_per_token(flops_shape(model), batch["input_ids"].shape[1]) + tower
    parts = vision_parts(model)
    roots = [parts.tower, *(name for name in parts.projectors if not name.startswith(parts.tower + "."))]
    by_module = counter.get_flop_counts()
    measured_tower = sum(sum(by_module[f"{type(model).__name__}.{root}"].values()) for root in roots)
    return counted, counter.get_total_flops(), tower, measured_tower


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_a_vlm_training_step_s_flops_match_torch_s_flop_counter(family):
    """The tower and projector exactly (a frozen tower: forward only); the whole step within 5% (the language
    model's per-token formula is measured within 3% of a text model's, see test_throughput)."""
    counted, measured, tower, measured_tower = _counted_and_measured(family)
    assert tower == measured_tower > 0
    assert counted == pytest.approx(measured, rel=0.05)


# A projector inside the tower (Qwen-VL's merger), and beside it (Gemma 3's).
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "gemma3"])
def test_a_trained_projector_s_backward_is_counted(family):
    frozen = _counted_and_measured(family)
    counted, measured, tower, measured_tower = _counted_and_measured(family, train_projector=True)
    assert tower == measured_tower > frozen[2]
    assert counted == pytest.approx(measured, rel=0.05)
