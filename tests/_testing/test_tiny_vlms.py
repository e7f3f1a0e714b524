"""The tiny vision-language models: small, deterministic, and trainable on images through their processors (their
families' facts: tests/vision/test_families.py; their save and reload: tests/vision/test_processor.py)."""

from __future__ import annotations

import pytest
import torch

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm, tiny_image
from hf_lora_ds.vision.families import family_of

FAMILIES = VLM_FAMILIES + MORE_VLM_FAMILIES


def _conversation(images: int, answer: str = "red") -> list[dict]:
    question = [{"type": "image"}] * images + [{"type": "text", "text": "Which colour is the square?"}]
    return [{"role": "user", "content": question}, {"role": "assistant", "content": [{"type": "text", "text": answer}]}]


def _batch(processor):
    """Two samples: two images of different sizes, then one; padded to one length."""
    texts = [processor.apply_chat_template(_conversation(2)), processor.apply_chat_template(_conversation(1))]
    images = [[tiny_image(0), tiny_image(1, size=48)], [tiny_image(2, size=80)]]
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_small_sized_for_its_tokenizer_and_deterministic(family):
    model, processor = build_tiny_vlm(family)
    assert model.config.model_type == family
    assert model.get_input_embeddings().num_embeddings == len(processor.tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 300_000
    batch = _batch(processor)
    with torch.no_grad():
        logits = model.eval()(**batch).logits
        assert torch.equal(build_tiny_vlm(family)[0].eval()(**batch).logits, logits)
        assert not torch.equal(build_tiny_vlm(family, seed=1)[0].eval()(**batch).logits, logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_with_images_trains_every_part(family):
    """Forward and backward with labels over a batch of varying image counts and sizes: a finite loss and a gradient
    in the language model, the projector and the tower."""
    model, processor = build_tiny_vlm(family)
    batch = _batch(processor)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    loss = model(**batch, labels=labels).loss
    assert torch.isfinite(loss)
    loss.backward()
    family_facts = family_of(model)
    for path in (family_facts.language_model, family_facts.tower, *family_facts.projector):
        grads = [p.grad for p in model.model.get_submodule(path).parameters()]
        assert any(g is not None and g.abs().sum() > 0 for g in grads), path


@pytest.mark.parametrize("family", FAMILIES)
def test_a_small_image_is_a_few_to_a_few_dozen_tokens(family):
    model, processor = build_tiny_vlm(family)
    text = processor.apply_chat_template(_conversation(1))
    ids = processor(text=[text], images=[[tiny_image()]]).input_ids[0]
    image_ids = family_of(model).image_token_ids(processor)
    assert 4 <= sum(i in image_ids for i in ids) <= 64


def test_tiny_images_are_deterministic():
    assert tiny_image(0).tobytes() == tiny_image(0).tobytes() != tiny_image(1).tobytes()
    assert tiny_image(size=48).size == (48, 48) and tiny_image().mode == "RGB"


def test_an_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="no tiny 'pixtral' model; families: qwen2_5_vl, qwen3_vl"):
        build_tiny_vlm("pixtral")
