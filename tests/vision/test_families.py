"""The facts of each vision family checked on its tiny model: its image's tokens, its tower, projector and language
model, and ``family_of``."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm, tiny_image
from hf_lora_ds.vision.families import VISION_FAMILIES, family_of

FAMILIES = VLM_FAMILIES + MORE_VLM_FAMILIES
QUESTION = [{"type": "text", "text": "Which colour is the square?"}]


def _conversation(images: int) -> list[dict]:
    return [
        {"role": "system", "content": [{"type": "text", "text": "Answer in one word."}]},
        {"role": "user", "content": [{"type": "image"}] * images + QUESTION},
        {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
    ]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    return build_tiny_vlm(request.param)


def test_every_tiny_family_is_known():
    assert set(FAMILIES) <= set(VISION_FAMILIES)


def test_family_of_a_model_its_config_and_its_peft_model(tiny):
    model, _ = tiny
    family = family_of(model)
    assert family is VISION_FAMILIES[model.config.model_type]
    assert family_of(model.config) is family
    language_model = family.language_model
    targets = rf"model\.{language_model}\.layers\.0\.self_attn\.q_proj"
    assert family_of(get_peft_model(model, LoraConfig(target_modules=targets))) is family


def test_a_text_only_model_has_no_family(tiny_model):
    assert family_of(tiny_model) is None
    assert family_of(tiny_model.config) is None


def test_only_qwen_vl_packs_exactly():
    assert {name for name, family in VISION_FAMILIES.items() if family.packs_exactly} == {
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_vl_moe",
    }


def test_every_parameter_is_in_the_language_model_the_tower_or_the_projector(tiny):
    """The paths name real modules, and together they cover the inner model: a projector inside the tower (Qwen's
    merger) counts as projector, so freezing the tower and the projector apart leaves nothing behind."""
    model, _ = tiny
    family = family_of(model)
    inner = model.model
    for path in (family.tower, family.language_model, *family.projector):
        assert isinstance(inner.get_submodule(path), torch.nn.Module), path
    parts = {name: inner.get_parameter(name) for name in family.projector_parameters}
    owners = Counter()
    for name, _ in inner.named_parameters():
        projector = any(name.startswith(path + ".") for path in family.projector) or name in parts
        tower = name.startswith(family.tower + ".") and not projector
        language = name.startswith(family.language_model + ".")
        owners[(language, tower, projector)] += 1
    assert set(owners) == {(True, False, False), (False, True, False), (False, False, True)}
    # The projector is what its classes call one (Qwen's mergers, SmolVLM's connector), all of them.
    projector_like = re.compile("Merger|Projector|Connector")
    for name, module in inner.named_modules():
        if projector_like.search(type(module).__name__):
            assert any(name == path or name.startswith(path + ".") for path in family.projector), name
    for path in family.projector:
        module = inner.get_submodule(path)
        members = list(module) if isinstance(module, torch.nn.ModuleList) else [module]  # Qwen3-VL's deepstack
        assert all(projector_like.search(type(member).__name__) for member in members), path


def test_the_image_tokens_cover_every_token_the_processor_inserts(tiny):
    """Two images: every token the template writes for them (the rendered text's tokens beyond those of the text with
    no image) and every token the processor adds in expanding them is an image token, or whitespace (InternVL's and
    LLaVA's templates end an image's line, Gemma 3 sets its images apart with blank lines); no token of the text with
    no image is one."""
    model, processor = tiny
    image_ids = family_of(model).image_token_ids(processor)
    text, text_only = (processor.apply_chat_template(_conversation(images)) for images in (2, 0))
    rendered, rendered_text_only = (_tokens(processor, text) for text in (text, text_only))
    written = Counter(rendered) - Counter(rendered_text_only)
    expanded = processor(text=[text], images=[[tiny_image(0), tiny_image(1)]]).input_ids[0]
    inserted = Counter(expanded) - Counter(rendered)
    assert _visible(written, processor) and _visible(inserted, processor)
    assert _visible(written, processor) | _visible(inserted, processor) <= image_ids
    assert image_ids.isdisjoint(rendered_text_only)
    assert getattr(model.config, "image_token_id", getattr(model.config, "image_token_index", None)) in image_ids


def _tokens(processor, text: str) -> list[int]:
    return processor.tokenizer(text, add_special_tokens=False).input_ids


def _visible(ids, processor) -> set[int]:
    """The ids that are not whitespace."""
    return {i for i in ids if processor.tokenizer.decode([i]).strip()}


def test_tiles_of_a_split_image_are_image_tokens():
    """SmolVLM splits a large image into tiles, each after its <row_i_col_j> token (added tokens in its vocabulary)."""
    model, processor = build_tiny_vlm("smolvlm")
    tiles = [f"<row_{row}_col_{col}>" for row in (1, 2) for col in (1, 2)]
    processor.tokenizer.add_special_tokens({"extra_special_tokens": tiles}, replace_extra_special_tokens=False)
    processor.image_processor.do_image_splitting = True
    processor.image_processor.max_image_size = {"longest_edge": 32}
    image_ids = family_of(model).image_token_ids(processor)
    assert set(processor.tokenizer.convert_tokens_to_ids(tiles)) <= image_ids
    text = processor.apply_chat_template(_conversation(images=1))
    expanded = processor(text=[text], images=[[tiny_image()]]).input_ids[0]
    inserted = Counter(expanded) - Counter(_tokens(processor, text))
    assert set(processor.tokenizer.convert_tokens_to_ids(tiles)) <= set(inserted)
    assert _visible(inserted, processor) <= image_ids
