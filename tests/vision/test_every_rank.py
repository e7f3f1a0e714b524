"""The blank image through the tower of an image-less forward (hf_lora_ds.vision.every_rank): the tower runs, the
loss and every gradient are what they are without it, and a batch with images is left as it is. The multi-process
runs it keeps in step are tests/e2e/test_vision_launchers.py's."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from hf_lora_ds._testing.tiny_vlms import VLM_FAMILIES, build_tiny_vlm
from hf_lora_ds.vision.collator import ProcessorOutputs
from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.every_rank import blank_image_pixels, run_tower_in_every_forward
from hf_lora_ds.vision.modules import vision_parts


def _setup(family: str):
    model, processor = build_tiny_vlm(family)
    encoding = ImageEncoding.of(processor)
    outputs = ProcessorOutputs.of(processor, encoding.image_text)
    parts = vision_parts(model)
    for name, param in model.named_parameters():  # the projector trains: its backward must run, with zero gradients
        param.requires_grad_(parts.part_of(name) != "vision tower")
    calls = []
    model.get_submodule(parts.tower).register_forward_pre_hook(lambda *_: calls.append(1))
    return model, processor, encoding, outputs, parts, calls


def _loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: param.grad for name, param in model.named_parameters() if param.requires_grad}


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_an_image_less_batch_runs_the_tower_with_the_same_loss_and_gradients(family):
    model, processor, encoding, outputs, parts, calls = _setup(family)
    ids = processor.tokenizer(["3+4=7", "a b c d e"], return_tensors="pt", padding=True)
    batch = {**ids, "labels": ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100)}
    batch.update(outputs.of_ids(batch["input_ids"]))

    loss, grads = _loss_and_grads(model, batch)
    assert not calls
    assert run_tower_in_every_forward(model, blank_image_pixels(processor, outputs))
    with_blank, blank_grads = _loss_and_grads(model, batch)
    assert len(calls) == 1  # the tower ran once, on the blank image

    assert torch.equal(with_blank, loss)
    for name, grad in grads.items():
        if grad is None:  # the projector (and OneVision's image_newline), unused without an image: zero with the blank
            assert parts.part_of(name) != "language model", name
            assert blank_grads[name] is None or not blank_grads[name].any(), name
        else:
            assert torch.equal(blank_grads[name], grad), name
    assert any(blank_grads[name] is not None for name in grads if parts.part_of(name) == "projector")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_a_batch_with_an_image_is_left_as_it_is(family):
    model, processor, encoding, outputs, parts, calls = _setup(family)
    text = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}], tokenize=False
    )
    batch = dict(processor(text=[text], images=[[Image.new("RGB", (64, 64), (255, 0, 0))]], return_tensors="pt"))
    batch["labels"] = batch["input_ids"].clone()

    loss, grads = _loss_and_grads(model, batch)
    run_tower_in_every_forward(model, blank_image_pixels(processor, outputs))
    again, grads_again = _loss_and_grads(model, batch)
    assert len(calls) == 2  # once each: the image's own, no blank one
    assert torch.equal(again, loss)
    assert all(torch.equal(grads_again[name], grad) for name, grad in grads.items() if grad is not None)


def test_a_text_model_gets_no_hooks(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not run_tower_in_every_forward(model, {"pixel_values": torch.zeros(1)})
