"""Vision-language models (issue 63) with the package's defaults: each family of ``VLM_FAMILIES``, named by its
directory as run_sft names it, trains a few steps on image records (text-only ones mixed in); its saved adapter has
trained language-model LoRA factors and nothing in the tower or projector, the processor's files beside it, and no
image token was ever a label."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hf_lora_ds._testing.tiny_vlms import VLM_FAMILIES, save_tiny_vlm, tiny_image
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer
from hf_lora_ds.vision.modules import LANGUAGE_MODEL, vision_parts
from hf_lora_ds.vision.processor import load_processor
from tests.trainer.test_run_inputs import arguments


@pytest.fixture(scope="module")
def image_records(tmp_path_factory) -> list[dict]:
    """Colour questions on 1-2 images of different sizes, every fourth record text-only."""
    folder = tmp_path_factory.mktemp("images")
    records = []
    for i in range(12):
        paths = []
        for j in range(0 if i % 4 == 3 else 1 + i % 2):
            path = folder / f"{i}_{j}.png"
            tiny_image(seed=i * 2 + j, size=40 + 8 * j).save(path)
            paths.append(str(path))
        parts = [{"type": "image", "image": path} for path in paths] + [{"type": "text", "text": "What is it?"}]
        records.append(
            {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": f"answer {i % 3}"}]}
        )
    return records


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_each_family_trains_with_the_defaults_on_image_records(family, image_records, tmp_path):
    base = save_tiny_vlm(family, tmp_path / "base")
    args = arguments(tmp_path, max_steps=3, eval_file="")
    trainer = LoraSFTTrainer(str(base), args, train_dataset=image_records)
    image_ids = torch.as_tensor(trainer.train_dataset.encoder.vision.image_ids)
    for sample in trainer.train_dataset:
        labels, ids = torch.tensor(sample["labels"]), torch.tensor(sample["input_ids"])
        assert torch.isin(ids, image_ids).sum() > 0 or not sample["images"]
        assert not torch.isin(labels, image_ids).any()  # no image token is ever a label
    trainer.train()
    trainer.save_model()  # the package's adapter check runs on the saved files

    parts = vision_parts(trainer.model)
    saved = load_file(f"{args.output_dir}/adapter_model.safetensors")
    trained_b = [name for name, tensor in saved.items() if "lora_B" in name and tensor.abs().sum() > 0]
    assert trained_b, "no trained lora_B"
    # Saved names drop PEFT's prefix: match each against the model's own module names by suffix.
    names = [name for name, _ in trainer.model.named_modules()]
    for key in saved:
        module = key.split(".lora_")[0]
        owner = next(name for name in names if name.endswith(module))
        assert parts.part_of(owner) == LANGUAGE_MODEL, key
    assert load_processor(args.output_dir) is not None  # image processor and chat template saved with the adapter
    assert json.loads((tmp_path / "out" / "adapter_config.json").read_text())["modules_to_save"] in (None, [])
