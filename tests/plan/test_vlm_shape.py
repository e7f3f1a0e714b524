"""The planner on a vision-language model: the frozen tower's weights counted with the language model's, and an
image sample's saved activations (its image tokens as sequence tokens, the frozen tower keeping nothing) equal to a
real training forward of the whole model with its image."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig

from hf_lora_ds._testing.tiny_vlms import VLM_FAMILIES, build_tiny_vlm, tiny_image
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.plan.model_shape import measure_model_shape
from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.modules import TOWER, vision_parts
from tests.plan.test_model_shape import saved_bytes


def _lora() -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")


def _saved_by_a_training_forward(model: torch.nn.Module, batch: dict) -> int:
    """Bytes autograd keeps over a real forward of the whole model (tower included), parameters excluded."""
    return saved_bytes(model, lambda: model.get_base_model().model(**batch, use_cache=False))


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_an_image_sample_is_planned_as_a_real_forward_saves_it(family):
    torch.manual_seed(0)
    model, processor = build_tiny_vlm(family)
    model.set_attn_implementation("eager")
    real = wrap_with_lora(model, _lora())
    text = ImageEncoding.of(processor).image_text + "which colour is the square? red"
    batch = dict(processor(text=[text], images=[[tiny_image(0, 64)]], return_tensors="pt"))
    length = batch["input_ids"].shape[1]
    shape = measure_model_shape(model.config, _lora(), torch.float32, seq_len=length, attn_implementation="eager")

    parts = vision_parts(real)
    tower = sum(p.numel() for name, p in real.named_parameters() if parts.part_of(name) == TOWER)
    assert tower > 0
    assert shape.frozen_params == sum(p.numel() for p in real.parameters() if not p.requires_grad)
    assert shape.frozen_weight_bytes == 4 * shape.frozen_params  # the tower's weights among them, in the run's dtype
    assert shape.trainable_params == sum(p.numel() for p in real.parameters() if p.requires_grad)
    saved = shape.activation_bytes(1, gradient_checkpointing=False) - shape.backward_working_bytes
    # Exact but for Qwen3-VL's deepstack, which keeps its boolean mask of the image positions (a byte a token).
    assert saved == pytest.approx(_saved_by_a_training_forward(real, batch), abs=length)
