"""A vision-language adapter merged into its base: exported with its processor, reloaded, the adapted logits on an
image prompt (hf_lora_ds.model.merge_adapter)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm, save_tiny_vlm
from hf_lora_ds.model.merge_adapter import _image_prompt, merge_adapter
from hf_lora_ds.vision.modules import auto_model_class
from hf_lora_ds.vision.processor import load_processor, save_processor


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_merged_vlm_reloads_with_its_processor_and_gives_the_adapted_logits(tmp_path, family):
    base = save_tiny_vlm(family, tmp_path / "base")
    model, processor = build_tiny_vlm(family)
    torch.manual_seed(0)
    adapted = get_peft_model(
        model, LoraConfig(r=4, target_modules=r".*language_model.*\.(q_proj|v_proj)", init_lora_weights=False)
    )
    adapted.save_pretrained(tmp_path / "adapter")
    save_processor(processor, tmp_path / "adapter")

    merge_adapter(base, tmp_path / "adapter", tmp_path / "merged")

    reloaded_processor = load_processor(tmp_path / "merged")
    assert reloaded_processor is not None  # image processor and chat template exported beside the weights
    inputs = _image_prompt(reloaded_processor, "What is in the picture?")
    assert inputs["input_ids"].shape == _image_prompt(processor, "What is in the picture?")["input_ids"].shape
    config = adapted.get_base_model().config
    merged = auto_model_class(config).from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        want = adapted.eval()(**inputs).logits
        with adapted.disable_adapter():
            base_logits = adapted(**inputs).logits
        got = merged(**inputs).logits
    assert (want - base_logits).abs().max() > 1e-3  # the adapter moves the logits on the image prompt
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
