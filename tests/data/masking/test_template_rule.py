"""The label rule on its own: what follows the inference prompt of each trained assistant turn, through its
end-of-turn token, is trained, in the text the template writes; a template the rule cannot read is one line."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.masking.template_rule import TemplateError, render_samples, token_difference, trained_turns

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
    assert sample.text.startswith(prompt) and sample.text[len(prompt) :].startswith("6<|im_end|>")


def test_only_the_last_turn_when_asked(chatml_tokenizer):
    assert trained_turns(CHAT, "last") == [4] and trained_turns(CHAT, "all") == [2, 4]
    (sample,) = render_samples(chatml_tokenizer, CHAT, assistant_turns="last")
    assert trained(sample.text, sample.spans) == ["6<|im_end|>"]


def test_a_template_that_rewrites_the_content_is_refused_naming_the_turn(chatml_tokenizer):
    shouting = chatml_tokenizer.chat_template.replace("message['content']", "message['content'] | upper")
    tokenizer = chatml_tokenizer.__class__(
        tokenizer_object=chatml_tokenizer.backend_tokenizer, eos_token="<|im_end|>", chat_template=shouting
    )
    with pytest.raises(TemplateError, match="changes the content of assistant turn 1"):
        render_samples(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])


def test_the_first_differing_token_is_named(chatml_tokenizer):
    prompt = chatml_tokenizer("<|im_start|>user\nhi", add_special_tokens=False)["input_ids"]
    text = chatml_tokenizer("<|im_start|>assistant\nhi", add_special_tokens=False)["input_ids"]
    difference = token_difference(chatml_tokenizer, prompt, text, "text")
    first = [chatml_tokenizer.decode([token]) for token in prompt[1:5]]
    assert difference.startswith(f"token 1: prompt {first} vs text [")


def _with_template(base, template: str, *specials: str):
    tokenizer = base.__class__(tokenizer_object=base.backend_tokenizer, eos_token="<|im_end|>", chat_template=template)
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    return tokenizer


# Mistral v3's way: no system turn, the system prompt written into the last user turn, a space after [/INST].
MISTRAL = (
    "{%- set system = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{%- set loop_messages = messages[1:] if system else messages %}{{ '<s>' }}"
    "{%- for m in loop_messages %}{%- if m['role'] == 'user' %}"
    "{%- if loop.last or loop_messages[loop.index0 + 1:] | selectattr('role', 'equalto', 'user') "
    "| list | length == 0 %}"
    "{{ '[INST] ' + (system + '\\n\\n' if system else '') + m['content'] + '[/INST]' }}"
    "{%- else %}{{ '[INST] ' + m['content'] + '[/INST]' }}{%- endif %}"
    "{%- else %}{{ ' ' + m['content'] + '</s>' }}{%- endif %}{%- endfor %}"
)


def test_history_that_moves_trains_each_turn_after_its_own_inference_prompt(chatml_tokenizer):
    tokenizer = _with_template(chatml_tokenizer, MISTRAL, "<s>", "</s>", "[INST]", "[/INST]")
    samples = render_samples(tokenizer, CHAT)
    assert [trained(sample.text, sample.spans) for sample in samples] == [[" 4</s>"], [" 6</s>"]]
    for sample, turn in zip(samples, (2, 4)):  # the system prompt sits in the turn's own last user message
        prompt = tokenizer.apply_chat_template(CHAT[:turn], tokenize=False, add_generation_prompt=True)
        assert sample.turns == [turn] and sample.text == prompt + " " + CHAT[turn]["content"] + "</s>"
        assert "[INST] Be brief.\n\n" + CHAT[turn - 1]["content"] in prompt


def test_a_wrapper_and_a_second_end_of_turn_token_are_trained(chatml_tokenizer):
    # Command-A's way: the answer inside <|START_RESPONSE|> ... <|END_RESPONSE|>, then the end-of-turn token.
    template = chatml_tokenizer.chat_template.replace(
        "'\\n' + message['content'] + '<|im_end|>\\n'",
        "'\\n' + ('<|S|>' + message['content'] + '<|E|>' if message['role'] == 'assistant' else message['content']) "
        "+ '<|im_end|>\\n'",
    )
    tokenizer = _with_template(chatml_tokenizer, template, "<|S|>", "<|E|>")
    (sample,) = render_samples(tokenizer, CHAT[:3])
    assert trained(sample.text, sample.spans) == ["<|S|>4<|E|><|im_end|>"]


def test_an_error_the_template_raises_is_one_line_naming_it(chatml_tokenizer):
    needs_tools = "{{ messages[0]['content'] + tools }}"  # None without tools: a TypeError inside Jinja
    refusing = "{{ raise_exception('System role not supported') }}"
    for template, said in [
        (refusing, "an exception: System role not supported"),
        (needs_tools, 'TypeError: can only concatenate str (not "NoneType") to str'),
    ]:
        tokenizer = _with_template(chatml_tokenizer, template)
        with pytest.raises(TemplateError) as err:
            render_samples(tokenizer, CHAT[1:3])
        assert str(err.value).startswith(f"the chat template raised {said}") and "\n" not in str(err.value)


def test_a_content_that_also_stands_in_a_header_is_found_where_the_answer_is(chatml_tokenizer):
    # GPT-OSS's way: "<|start|>assistant<|channel|>final<|message|>" after the reasoning; an answer "assistant" must
    # not end the turn at the header's "assistant" (followed by a special token there too).
    template = (
        "{%- for m in messages %}{%- if m.role == 'user' %}{{ '<|start|>user<|message|>' + m.content + '<|end|>' }}"
        "{%- else %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + m.reasoning_content + '<|end|>' }}"
        "{{ '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|return|>' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|start|>assistant' }}{%- endif %}"
    )
    tokenizer = _with_template(
        chatml_tokenizer, template, "<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>"
    )
    turn = {"role": "assistant", "content": "assistant", "reasoning_content": "hmm"}
    (sample,) = render_samples(tokenizer, [{"role": "user", "content": "who?"}, turn])
    assert trained(sample.text, sample.spans) == [
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>assistant<|return|>"
    ]


def test_a_system_prompt_moved_elsewhere_than_the_last_user_turn_is_refused(chatml_tokenizer):
    # The Mistral v0.3 shape (system prompt in the user turn that is the last message) is trained turn by turn
    # (tests/data/masking/test_template_shapes.py); a template that moves it into the assistant turn instead would have
    # it trained as part of the reply, so it is refused.
    template = MISTRAL.replace(
        "loop.last or loop_messages[loop.index0 + 1:] | selectattr('role', 'equalto', 'user') | list | length == 0",
        "loop.last",
    ).replace(
        "{{ ' ' + m['content'] + '</s>' }}",
        "{{ ' ' + (system + ' ' if loop.last and system else '') + m['content'] + '</s>' }}",
    )
    tokenizer = _with_template(chatml_tokenizer, template, "<s>", "</s>", "[INST]", "[/INST]")
    assert tokenizer.apply_chat_template(CHAT[:3], tokenize=False).endswith("[/INST] Be brief. 4</s>")
    with pytest.raises(TemplateError, match="generation prompt is not a prefix of assistant turn 2"):
        render_samples(tokenizer, CHAT[:3])


def test_ignore_index_has_one_definition():
    """The label of an untrained token is defined here and imported everywhere else (a second -100 drifts)."""
    import re
    from pathlib import Path

    import hf_lora_ds

    package = Path(hf_lora_ds.__file__).parent
    defining = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if re.search(r"^IGNORE_INDEX\s*=", path.read_text(encoding="utf-8"), re.M)
    )
    assert defining == ["data/masking/template_rule.py"]


# A content-blind template that appends its thinking-off marker to whatever it renders, as Hunyuan's do.
OFF_MARKER_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n' }}{% endif %}"
)


def test_a_thinking_off_marker_appended_to_every_render_ends_each_turns_prompt_and_no_history(chatml_tokenizer):
    """Each turn trains after its inference prompt, which ends with the marker; the history holds none, so each turn
    is a text of its own (and the skeleton, which cannot prove that, leaves such a template to the rule)."""
    from hf_lora_ds._testing.tiny_models import template_tokenizer
    from hf_lora_ds.data.dataset import _Encoder
    from hf_lora_ds.data.formats import FormatOptions
    from hf_lora_ds.data.masking.thinking import ThinkingOptions

    tokenizer = template_tokenizer(chatml_tokenizer, OFF_MARKER_TEMPLATE)
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "Why"},
        {"role": "assistant", "content": "So"},
    ]
    encoder = _Encoder(tokenizer, None, None, "all", FormatOptions(), ThinkingOptions())
    samples = encoder.samples({"messages": messages, "tools": None})
    for sample, turn in zip(samples, (1, 3)):
        prompt = tokenizer.apply_chat_template(
            messages[:turn], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        assert prompt.endswith("<|assistant|><think>\n\n</think>\n")
        assert sample.text == prompt + messages[turn]["content"] + "<|end|>"
        assert [sample.text[a:b] for a, b in sample.spans] == [messages[turn]["content"] + "<|end|>"]
