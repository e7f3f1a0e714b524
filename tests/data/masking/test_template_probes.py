"""The template traits the label rule reads, found by render probes on real templates (TRL's) and on spellings no
TRL template has (``[THINK]``, ``<seed:think>``)."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.masking.template_probes import TemplateTraits, closing_tag, next_special_token, probe_template
from tests.data.masking.test_trl_templates import _base, encoder

pytest.importorskip("trl")


def traits(name: str) -> TemplateTraits:
    return encoder(name).rules.traits


@pytest.mark.parametrize(
    "name, close, think_open",
    [
        ("qwen3", "\n</think>\n\n", None),  # the turn writes the block, the prompt opens none
        ("qwen3_5_think", "\n</think>\n\n", "<think>"),  # the prompt opens it
        ("deepseek_r1_distill", "\n</think>\n\n", "<think>"),  # opened by the prompt, dropped by history
        ("nemotron_3_nano", "\n</think>\n", "<think>"),
        ("gptoss", "<|end|><|start|>assistant<|channel|>final<|message|>", None),
        ("muse_glimmer", "<|eom|><|start|>assistant to=user<|message|>", None),
        ("llama3", None, None),  # <|end_header_id|> ends its prompt: a turn header, not a think tag
        ("phi3", None, None),
    ],
)
def test_reasoning_spelling_is_found_by_rendering(name, close, think_open):
    found = traits(name)
    assert (found.close, found.think_open, found.writes_reasoning) == (close, think_open, close is not None)


def test_a_template_without_a_token_after_its_last_turn_gets_the_next_turns():
    assert traits("glm4moe").turn_closers == {"user": "<|user|>", "tool": "<|observation|>"}
    assert traits("qwen3").turn_closers is None


@pytest.mark.parametrize("tag", ["[THINK]", "<seed:think>"])
def test_other_think_spellings_opened_by_the_prompt(tag):
    close = closing_tag(tag)
    template = (
        "{% for m in messages %}{% if m.role == 'user' %}{{ '<|u|>' + m.content }}{% else %}"
        "{{ '<|a|>' + (m.content.split('" + close + "')[-1] | trim) + '<|e|>' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|a|>" + tag + "\\n' }}{% endif %}"
    )
    tokenizer = _base().__class__(tokenizer_object=_base().backend_tokenizer, chat_template=template)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|u|>", "<|a|>", "<|e|>"]})
    assert probe_template(tokenizer, tuple(tokenizer.all_special_tokens)) == TemplateTraits(
        close=f"\n{close}\n\n", think_open=tag, turn_closers=None
    )
    assert closing_tag("<think>") == "</think>" and close in ("[/THINK]", "</seed:think>")


def test_a_template_that_raises_on_the_probes_has_no_traits():
    tokenizer = _base().__class__(
        tokenizer_object=_base().backend_tokenizer, chat_template="{{ raise_exception('needs tools') }}"
    )
    assert probe_template(tokenizer, ()) == TemplateTraits(None, None, None)


def test_next_special_token_is_the_longest_that_starts_the_text():
    assert next_special_token("<|im_end|>\n", ("<|im", "<|im_end|>")) == "<|im_end|>"
    assert next_special_token("\n<|im_end|>", ("<|im_end|>",)) is None


def test_the_thinking_off_marker_appended_to_every_render_and_the_think_answer_shape_are_found():
    """Hunyuan's templates append '<think>\\n\\n</think>\\n' to whatever they render with thinking off and write no
    reasoning: the model writes that block in its reply; the dense template takes '<answer>' tags off history."""
    from tests.data.masking.test_template_shapes import encoder as shape_encoder

    dense, a13b = (shape_encoder(name).rules.traits for name in ("hunyuan_dense_instruct", "hunyuan_a13b_instruct"))
    for found in (dense, a13b):
        assert (found.off_suffix, found.reply_block, found.close) == (
            "<think>\n\n</think>\n",
            "<think>\n",
            "\n</think>\n",
        )
    assert dense.answer_tags == ("<answer>\n", "\n</answer>") and a13b.answer_tags is None


@pytest.mark.parametrize(
    "name", ["qwen3", "qwen3_5_think", "deepseek_r1_distill", "nemotron_3_nano", "glm4moe", "llama3"]
)
def test_templates_that_write_their_empty_block_into_the_prompt_only_have_no_off_marker(name):
    found = traits(name)
    assert (found.off_suffix, found.reply_block, found.answer_tags) == (None, None, None)
