"""The tiny vision-language models' chat templates train as the package's masking rule reads a template: the
generation prompt is a prefix of the turn that answers it, and the answer ends with the end-of-turn token."""

from __future__ import annotations

import pytest

from hf_lora_ds._testing.tiny_vlm_templates import TEMPLATES
from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm

FAMILIES = VLM_FAMILIES + MORE_VLM_FAMILIES
IMAGE = {"type": "image"}
QUESTION = {"type": "text", "text": "Which colour is the square?"}


@pytest.fixture(scope="module", params=FAMILIES)
def processor(request):
    return build_tiny_vlm(request.param)[1]


def test_every_family_has_a_template():
    assert set(TEMPLATES) == set(FAMILIES)


@pytest.mark.parametrize("system", [None, "Answer in one word.", [{"type": "text", "text": "Answer in one word."}]])
def test_the_generation_prompt_opens_the_answer_which_ends_its_turn(processor, system):
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user", "content": [IMAGE, QUESTION]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    answer = {"role": "assistant", "content": [{"type": "text", "text": "red"}]}
    answered = processor.apply_chat_template([*messages, answer])
    assert answered.startswith(prompt)
    assert answered[len(prompt) :].lstrip().removeprefix("red").rstrip() == processor.tokenizer.eos_token
    if system:
        assert "Answer in one word." in prompt


def test_an_image_is_written_as_the_processor_expects_it(processor):
    """One placeholder for the processor to expand where the image part stands, before the question's text."""
    text = processor.apply_chat_template([{"role": "user", "content": [IMAGE, QUESTION]}])
    assert text.count(processor.image_token) == 1
    assert text.index(processor.image_token) < text.index(QUESTION["text"])


def test_string_content_is_written_as_it_is(processor):
    """A record's text with its image placeholder already in it, as a string."""
    content = f"{processor.image_token}{QUESTION['text']}"
    assert content in processor.apply_chat_template([{"role": "user", "content": content}])
