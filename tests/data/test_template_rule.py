"""The label rule on its own: what follows the inference prompt of each trained assistant turn, through its
end-of-turn token, is trained, in the text the template writes; a template the rule cannot read is one line."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.template_rule import TemplateError, render_samples, token_difference, trained_turns

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6"},
]


def trained(text: str, spans: list[tuple[int, int]]) -> list[str]:
    return [text[start:stop] for start, stop in spans]


def test_each_assistant_reply_and_its_end_of_turn_are_the_spans(chatml_tokenizer):
    (sample,) = render_samples(chatml_tokenizer, CHAT)
    assert trained(sample.text, sample.spans) == ["4<|im_end|>", "6<|im_end|>"]
    assert sample.turns == [2, 4]
    prompt = chatml_tokenizer.apply_chat_template(CHAT[:4], tokenize=False, add_generation_prompt=True)
    assert sample.text.startswith(prompt) and sample.text[len(prompt):].startswith("6<|im_end|>")


def test_only_the_last_turn_when_asked(chatml_tokenizer):
    assert trained_turns(CHAT, "last") == [4] and trained_turns(CHAT, "all") == [2, 4]
    (sample,) = render_samples(chatml_tokenizer, CHAT, assistant_turns="last")
    assert trained(sample.text, sample.spans) == ["6<|im_end|>"]


def test_a_template_that_rewrites_the_content_is_refused_naming_the_turn(chatml_tokenizer):
    shouting = chatml_tokenizer.chat_template.replace("message['content']", "message['content'] | upper")
    tokenizer = chatml_tokenizer.__class__(tokenizer_object=chatml_tokenizer.backend_tokenizer,
                                           eos_token="<|im_end|>", chat_template=shouting)  # fmt: skip
    with pytest.raises(TemplateError, match="changes the content of assistant turn 1"):
        render_samples(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])


def test_the_first_differing_token_is_named(chatml_tokenizer):
    prompt = chatml_tokenizer("<|im_start|>user\nhi", add_special_tokens=False)["input_ids"]
    text = chatml_tokenizer("<|im_start|>assistant\nhi", add_special_tokens=False)["input_ids"]
    difference = token_difference(chatml_tokenizer, prompt, text, "text")
    first = [chatml_tokenizer.decode([token]) for token in prompt[1:5]]
    assert difference.startswith(f"token 1: prompt {first} vs text [")
