"""Batches of image samples: a batch mixing samples with 0, 1 and 2 images of different sizes gives each sample the
loss it has alone, where "alone" is the processor's own output for the sample (ids, per-token keys, pixels) through
the model, not the collator's; and the collator's per-token keys and pixels are the processor's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES
from hf_lora_ds.data.batches.collator import padded_collator
from hf_lora_ds.data.dataset import IGNORE_INDEX
from hf_lora_ds.vision.collator import VisionCollator
from tests.vision.conftest import family_and_records, image_folder, once_per_family, write_conversations

FAMILIES = VLM_FAMILIES + MORE_VLM_FAMILIES
SIZES = {"a.png": (64, 64), "b.png": (48, 80), "c.png": (96, 64)}
PER_TOKEN_KEYS = ("mm_token_type_ids", "token_type_ids")


def image(name: str) -> dict:
    return {"type": "image", "image": f"img/{name}"}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


# One image, none, two of different sizes: the batch's samples in this order.
CONVERSATIONS = [
    [{"role": "user", "content": [image("a.png"), text("colour?")]}, {"role": "assistant", "content": "red"}],
    [{"role": "user", "content": [text("hello")]}, {"role": "assistant", "content": "hi there, friend"}],
    [
        {"role": "user", "content": [text("compare "), image("b.png"), text(" and "), image("c.png")]},
        {"role": "assistant", "content": "the second is wider"},
    ],
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision_batches")
    image_folder(root, SIZES)
    write_conversations(root, CONVERSATIONS)
    return root


@pytest.fixture(scope="module")
def built(root):
    """``family -> (model in eval mode, processor, dataset of CONVERSATIONS)``, each built once for the module."""

    def build(family: str) -> tuple:
        model, processor, dataset = family_and_records(family, root)
        return model.eval(), processor, dataset

    return once_per_family(build)


def alone(processor, messages: list[dict], root: Path) -> dict:
    """The processor's own tensors for one conversation: the template's text with its image parts, and the images."""
    rendered = processor.tokenizer.apply_chat_template(messages, tokenize=False)
    images = [
        Image.open(root / part["image"]).convert("RGB")
        for message in messages
        for part in message["content"]
        if isinstance(message["content"], list) and part["type"] == "image"
    ]
    return dict(processor(text=[rendered], images=[images] if images else None, return_tensors="pt"))


def sample_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's mean next-token cross-entropy over its supervised tokens."""
    losses = F.cross_entropy(
        logits[:, :-1].transpose(1, 2).float(), labels[:, 1:], ignore_index=IGNORE_INDEX, reduction="none"
    )
    return losses.sum(dim=1) / (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch_gives_each_sample_its_own_loss(family, built, root):
    model, processor, dataset = built(family)
    assert [len(dataset[k]["images"]) for k in range(len(dataset))] == [1, 0, 2]
    collator = VisionCollator(padded_collator(processor.tokenizer), dataset.encoder.vision)
    batch = collator([dataset[k] for k in range(len(dataset))])
    labels = batch.pop("labels")
    with torch.no_grad():
        batch_losses = sample_losses(model(**batch, use_cache=False).logits, labels)
    for k, messages in enumerate(CONVERSATIONS):
        own = alone(processor, messages, root)
        sample_labels = torch.tensor([dataset[k]["labels"]])
        length = sample_labels.shape[1]
        assert torch.equal(own["input_ids"], batch["input_ids"][k : k + 1, :length])
        for key in PER_TOKEN_KEYS:
            if key in own:
                assert torch.equal(own[key], batch[key][k : k + 1, :length]), key
        with torch.no_grad():
            own_loss = sample_losses(model(**own, use_cache=False).logits, sample_labels)
        torch.testing.assert_close(batch_losses[k], own_loss[0], rtol=1e-5, atol=1e-5, msg=f"sample {k}")
    assert {key for key in PER_TOKEN_KEYS if key in alone(processor, CONVERSATIONS[0], root)} <= batch.keys()


@pytest.mark.parametrize("family", FAMILIES)
def test_pixels_of_one_sample_are_the_processors(family, built, root):
    _, processor, dataset = built(family)
    collator = VisionCollator(padded_collator(processor.tokenizer), dataset.encoder.vision)
    for k in (0, 2):
        own = alone(processor, CONVERSATIONS[k], root)
        batch = collator([dataset[k]])
        pixel_keys = set(own) - {"input_ids", "attention_mask", *PER_TOKEN_KEYS}
        assert pixel_keys and pixel_keys <= batch.keys()
        for key in pixel_keys:
            assert torch.equal(torch.as_tensor(own[key]), torch.as_tensor(batch[key])), key
    assert not set(collator([dataset[1]])) - {"input_ids", "attention_mask", "labels", *PER_TOKEN_KEYS}
