"""A vision-language processor built, saved and reloaded by the package, also without torchvision."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForImageTextToText
from transformers.utils import is_torchvision_available

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm, save_tiny_vlm, tiny_image
from hf_lora_ds.errors import UserError
from hf_lora_ds.resources import DEMO_MODEL
from hf_lora_ds.vision.processor import load_processor, make_processor

CONVERSATION = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour is the square?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
]
no_torchvision = pytest.mark.skipif(is_torchvision_available(), reason="the refusal is for machines without it")


def _inputs(processor) -> dict[str, torch.Tensor]:
    text = processor.apply_chat_template(CONVERSATION)
    return processor(text=[text], images=[[tiny_image()]], return_tensors="pt")


def _assert_same_inputs(processor, reloaded) -> None:
    expected, got = _inputs(processor), _inputs(reloaded)
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("family", VLM_FAMILIES + MORE_VLM_FAMILIES)
def test_a_saved_tiny_model_reloads_with_the_same_inputs_and_logits(family, tmp_path):
    model, processor = build_tiny_vlm(family)
    reloaded = load_processor(save_tiny_vlm(family, tmp_path))
    assert type(reloaded).__name__ == type(processor).__name__
    assert reloaded.chat_template == processor.chat_template
    _assert_same_inputs(processor, reloaded)
    inputs = _inputs(reloaded)
    with torch.no_grad():
        expected = model.eval()(**inputs).logits
        got = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()(**inputs).logits
    assert torch.equal(got, expected)


def test_the_settings_of_the_processor_are_saved_and_reloaded(tmp_path):
    """SmolVLM's image_seq_len (16 here, 169 by default) decides how many tokens an image expands to."""
    processor = load_processor(save_tiny_vlm("smolvlm", tmp_path))
    assert processor.image_seq_len == 16
    assert json.loads((tmp_path / "processor_config.json").read_text()) == {
        "image_seq_len": 16,
        "processor_class": "SmolVLMProcessor",
    }


def test_a_text_only_checkpoint_has_no_processor():
    assert load_processor(DEMO_MODEL) is None


def test_transformers_own_save_reloads(tmp_path):
    """transformers 5 saves the image processor nested in processor_config.json, with no preprocessor_config.json."""
    _, processor = build_tiny_vlm("llava")
    processor.save_pretrained(tmp_path)
    assert not (tmp_path / "preprocessor_config.json").exists()
    _assert_same_inputs(processor, load_processor(tmp_path))


def test_an_older_checkpoint_names_its_processor_and_template_elsewhere(tmp_path):
    """Checkpoints saved before transformers 4.5x: the processor class in preprocessor_config.json, the template in
    chat_template.json, no processor_config.json."""
    _, processor = build_tiny_vlm("qwen2_5_vl")
    save_tiny_vlm("qwen2_5_vl", tmp_path)
    (tmp_path / "processor_config.json").unlink()
    template = (tmp_path / "chat_template.jinja").read_text()
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    image_config = tmp_path / "preprocessor_config.json"
    named = {**json.loads(image_config.read_text()), "processor_class": "Qwen2_5_VLProcessor"}
    image_config.write_text(json.dumps(named))
    _assert_same_inputs(processor, load_processor(tmp_path))


def test_a_processor_built_without_its_video_processor_refuses_videos():
    _, processor = build_tiny_vlm("qwen3_vl")
    with pytest.raises(UserError, match="without its video processor"):
        processor.video_processor(videos=[])


def test_a_processor_without_a_video_slot_is_the_class_itself():
    _, processor = build_tiny_vlm("llava")
    rebuilt = make_processor(type(processor), processor.image_processor, processor.tokenizer, patch_size=8)
    assert type(rebuilt) is type(processor) and type(rebuilt).__module__ == "transformers.models.llava.processing_llava"


@no_torchvision
@pytest.mark.parametrize(
    ("model_type", "image_processor", "processor"),
    [("lfm2_vl", "Lfm2VlImageProcessor", "Lfm2VlProcessor"), ("llava", "PixtralImageProcessor", "PixtralProcessor")],
)
def test_a_family_that_needs_torchvision_is_refused_in_one_line(tmp_path, model_type, image_processor, processor):
    """LFM2-VL's image processor is a torchvision class only; Pixtral's processor requires torchvision itself."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL / name, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": image_processor}))
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": processor}))
    with pytest.raises(UserError, match=rf"^{tmp_path}: {processor} needs torchvision .* install") as refused:
        load_processor(tmp_path)
    assert "\n" not in str(refused.value)
