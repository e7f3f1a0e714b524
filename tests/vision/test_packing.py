"""Packed and padding-free Qwen-VL rows give each sample the logits it has alone: its 3-D rotary positions from the
model's own rope index per sample, and the 1-D positions in front so attention keeps the samples apart. Without them
(plain 1-D positions) the logits differ, so the check can fail; a family without a rope index is refused in one line.

"Alone" is the processor's own output for the sample's conversation through the model, not the package's collator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import DataCollatorWithFlattening

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm
from hf_lora_ds.data.batches.packing import PackedCollator, PackedDataset
from hf_lora_ds.data.dataset import IGNORE_INDEX
from hf_lora_ds.errors import UserError
from hf_lora_ds.vision.collator import VisionCollator
from hf_lora_ds.vision.packing import packed_rope_index
from tests.vision.conftest import family_and_records, image_folder, once_per_family, write_conversations

QWEN_VL = tuple(family for family in VLM_FAMILIES + MORE_VLM_FAMILIES if family.startswith("qwen"))
SIZES = {"a.png": (64, 64), "b.png": (48, 80), "c.png": (96, 64)}
TOLERANCE = 1e-5


def image(name: str) -> dict:
    return {"type": "image", "image": f"img/{name}"}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


CONVERSATIONS = [
    [{"role": "user", "content": [image("a.png"), text("colour?")]}, {"role": "assistant", "content": "red"}],
    [
        {"role": "user", "content": [text("compare "), image("b.png"), text(" and "), image("c.png")]},
        {"role": "assistant", "content": "the second is wider"},
    ],
    [{"role": "user", "content": [text("hello")]}, {"role": "assistant", "content": "hi"}],
    [{"role": "user", "content": [image("c.png"), text("what is it?")]}, {"role": "assistant", "content": "a dog"}],
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision_packing")
    image_folder(root, SIZES)
    write_conversations(root, CONVERSATIONS)
    return root


@pytest.fixture(scope="module")
def built(root):
    """``family -> (model, processor, dataset, each conversation's logits alone)``, built once for the module."""

    def build(family: str) -> tuple:
        model, processor, dataset = family_and_records(family, root)
        model.set_attn_implementation("sdpa")
        model.eval()
        with torch.no_grad():
            alone = [model(**own(processor, m, root), use_cache=False).logits[0] for m in CONVERSATIONS]
        return model, processor, dataset, alone

    return once_per_family(build)


def own(processor, messages: list[dict], root: Path) -> dict:
    """The processor's own tensors for one conversation: the template's text with its image parts, and the images."""
    rendered = processor.tokenizer.apply_chat_template(messages, tokenize=False)
    images = [
        Image.open(root / part["image"]).convert("RGB")
        for message in messages
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image"
    ]
    return dict(processor(text=[rendered], images=[images] if images else None, return_tensors="pt"))


def test_the_qwen_vl_families_are_packed():
    assert {"qwen2_5_vl", "qwen3_vl", "qwen2_vl"} <= set(QWEN_VL)


def packed_logits(model, batch: dict) -> torch.Tensor:
    batch = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        return model(**batch, use_cache=False).logits


def worst_sample(logits: torch.Tensor, rows: list[list[int]], dataset, alone: list[torch.Tensor]) -> float:
    """The largest difference between a sample's logits in its packed row and its logits alone."""
    worst = 0.0
    for r, row in enumerate(rows):
        start = 0
        for k in row:
            length = len(dataset[k]["input_ids"])
            assert alone[k].shape[0] == length
            worst = max(worst, (logits[r, start : start + length] - alone[k]).abs().max().item())
            start += length
    return worst


@pytest.mark.parametrize("family", QWEN_VL)
def test_packed_rows_give_each_sample_its_logits_alone(family, built):
    model, processor, dataset, alone = built(family)
    rows = PackedDataset(dataset, capacity=sum(dataset.lengths) // 2 + 8)
    assert len(rows) == 2 and all(len(row) == 2 for row in rows.rows)  # two rows of two samples, images in both
    collator = VisionCollator(
        PackedCollator(processor.tokenizer.pad_token_id), dataset.encoder.vision, packed_rope_index("packed", model)
    )
    batch = collator([rows[0], rows[1]])
    assert batch["position_ids"].shape == (4, *batch["input_ids"].shape)
    assert worst_sample(packed_logits(model, batch), rows.rows, dataset, alone) < TOLERANCE
    # the wrong way: the same rows with plain 1-D positions, as a text model's packing gives them
    plain = {**batch, "position_ids": batch["position_ids"][0]}
    assert worst_sample(packed_logits(model, plain), rows.rows, dataset, alone) > 1e-3


@pytest.mark.parametrize("flatten", ["transformers", "package"])
@pytest.mark.parametrize("family", QWEN_VL)
def test_padding_free_rows_give_each_sample_its_logits_alone(family, flatten, built):
    model, processor, dataset, alone = built(family)
    text_collator = (
        DataCollatorWithFlattening(separator_id=IGNORE_INDEX)
        if flatten == "transformers"
        else PackedCollator(processor.tokenizer.pad_token_id, flatten=True)
    )
    collator = VisionCollator(text_collator, dataset.encoder.vision, packed_rope_index("padding_free", model))
    order = [1, 2, 0, 3]  # two images, none, one, one
    batch = collator([dataset[k] for k in order])
    assert batch["input_ids"].shape[0] == 1
    assert worst_sample(packed_logits(model, batch), [order], dataset, alone) < TOLERANCE


@pytest.mark.parametrize("batching", ["packed", "padding_free"])
def test_family_without_rope_index_is_refused_for_packing(batching):
    model, _ = build_tiny_vlm("llava")
    with pytest.raises(UserError) as err:
        packed_rope_index(batching, model)
    message = str(err.value)
    assert f"--batching {batching}" in message and "padded" in message and "\n" not in message
    assert packed_rope_index("padded", model) is None
