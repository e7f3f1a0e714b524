"""The plan's data line for a vision-language model: how many images the data holds and their tokens, counted from
the images' sizes alone, equal to the image tokens the dataset's own ids hold."""

from __future__ import annotations

import numpy as np
import pytest

from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.plan import profile_from_dataset
from tests.vision.conftest import image_folder, write_conversations

SIZES = {"a.png": (64, 64), "b.png": (40, 90), "c.png": (200, 120)}  # Qwen: 4, 3 and 2 placeholders (+ 2 markers)


def conversation(*names: str) -> list[dict]:
    parts = [{"type": "image", "image": f"img/{name}"} for name in names]
    return [
        {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A square."},
    ]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl", "smolvlm"])
def test_image_tokens_are_those_of_the_dataset(tmp_path, family):
    _, processor = build_tiny_vlm(family)
    root = image_folder(tmp_path, SIZES)
    records = write_conversations(root, [conversation("a.png"), conversation("b.png", "c.png"), conversation()])
    dataset = ChatSFTDataset(str(records), processor.tokenizer, processor=processor, cache_dir=root / "cache")
    profile = profile_from_dataset(dataset)
    ids = np.concatenate(dataset.samples.with_format(None)["input_ids"])
    assert len(profile.image_tokens_first) == 3
    assert sum(profile.image_tokens_first) == np.isin(ids, dataset.encoder.vision.image_ids).sum()
    assert f"; images: 3, at most {profile.image_tokens_first[0]} tokens each" in profile.line()


def test_qwen_counts_in_the_data_line(tmp_path):
    _, processor = build_tiny_vlm("qwen2_5_vl")
    root = image_folder(tmp_path, SIZES)
    records = write_conversations(root, [conversation("a.png"), conversation("b.png", "c.png")])
    dataset = ChatSFTDataset(str(records), processor.tokenizer, processor=processor, cache_dir=root / "cache")
    profile = profile_from_dataset(dataset)
    assert profile.image_tokens_first == (6, 5, 4)
    assert profile.line().endswith("; images: 3, at most 6 tokens each, 15 in all")


def test_text_data_has_no_images_line(tmp_path):
    _, processor = build_tiny_vlm("qwen2_5_vl")
    records = write_conversations(tmp_path, [conversation()])
    dataset = ChatSFTDataset(str(records), processor.tokenizer, cache_dir=tmp_path / "cache")
    profile = profile_from_dataset(dataset)
    assert profile.image_tokens_first == () and "images" not in profile.line()
