"""Content as a list of typed parts (OpenAI / HF, LLaMA-Factory v1): text joined in order, other media refused."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds._testing.tiny_models import template_tokenizer
from hf_lora_ds.data.audit.mask_audit import show_samples
from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.masking.template_rule import TemplateError
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.content_parts import drop_parts
from tests.data.peer_records import END, build, chatml, expect, labels_of, sample


def test_openai_text_parts_are_joined_in_order_and_trained_as_a_string(chatml_tokenizer, tmp_path):
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "a joke"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "cats"}, {"type": "text", "text": "."}]},
        ]
    }
    text = chatml(("user", "Tell me a joke"), ("assistant", "cats."))
    assert sample(build([record], chatml_tokenizer, tmp_path)) == expect(chatml_tokenizer, text, ["cats." + END])


def test_llamafactory_v1_value_parts_with_reasoning_and_tool_calls():
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "value": "Weather?"}], "loss_weight": 0.0},
            {
                "role": "assistant",
                "content": [
                    {"type": "reasoning", "value": "Look it up."},
                    {"type": "tool_call", "value": json.dumps(call)},
                ],
                "loss_weight": 1.0,
            },
            {"role": "tool", "content": [{"type": "text", "value": "sunny"}]},
            {"role": "assistant", "content": [{"type": "text", "value": "Sunny."}], "loss_weight": 1},
        ]
    }
    messages = [drop_parts(message) for message in to_conversation(record, "r")["messages"]]
    assert messages[0] == {"role": "user", "content": "Weather?"}
    assert messages[1] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Look it up.",
        "tool_calls": [{"type": "function", "function": call}],
    }
    assert messages[3] == {"role": "assistant", "content": "Sunny."}


def test_llamafactory_v1_tool_call_parts_train_as_the_calls_they_are(qwen3_tokenizer, tmp_path):
    """LLaMA-Factory v1 (its reason_tool_use demo's shape): a tool_call part holds one call as JSON; two parts are
    two calls. With a template that writes tools (Qwen3's), the turn trains its reasoning and the calls as written."""
    calls = [{"name": "get_weather", "arguments": {"city": city}} for city in ("Paris", "Rome")]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "value": "Weather in Paris and Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "reasoning", "value": "Look both up."},
                    *({"type": "tool_call", "value": json.dumps(call)} for call in calls),
                ],
            },
            {"role": "tool", "content": [{"type": "text", "value": "sunny"}]},
            {"role": "tool", "content": [{"type": "text", "value": "rain"}]},
            {"role": "assistant", "content": [{"type": "text", "value": "Sunny, then rain."}]},
        ],
        "tools": json.dumps(tools),
    }
    assert to_conversation(record, "r")["messages"][1]["tool_calls"] == [
        {"type": "function", "function": call} for call in calls
    ]
    shown = json.loads(show_samples(build([record], qwen3_tokenizer, tmp_path), 1, "jsonl"))
    written = "".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)
    reply = "<think>\nLook both up.\n</think>\n\n" + written.replace(
        "</tool_call><tool_call>", "</tool_call>\n<tool_call>"
    )
    assert [shown["text"][a:b] for a, b in shown["trained"]][0] == reply + END


def test_axolotl_per_part_train_flags_switch_the_characters_of_their_part(chatml_tokenizer, tmp_path):
    """axolotl's documented content parts example: a part without a flag follows the turn, one with a flag is
    trained or not as it says; the turn's end of turn follows the turn (trained by default)."""
    thinking, answer = "Let me think step by step...", " The answer is 4."
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": thinking, "train": False}, {"type": "text", "text": answer}],
            },
        ]
    }
    text = chatml(("user", "What is 2+2?"), ("assistant", thinking + answer))
    start = text.index(answer + END)
    trained = [start <= i < start + len(answer + END) for i in range(len(text))]
    assert sample(build([record], chatml_tokenizer, tmp_path)) == labels_of(chatml_tokenizer, text, trained)
    record["messages"][1]["content"][1]["weight"] = 0  # every part off: the end of turn alone
    end = text.index(END, start)
    trained = [end <= i < end + len(END) for i in range(len(text))]
    assert sample(build([record], chatml_tokenizer, tmp_path / "b")) == labels_of(chatml_tokenizer, text, trained)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            {"role": "assistant", "content": [{"type": "reasoning", "value": "r", "train": False}]},
            r"^r: field 'messages\[1\].content\[0\]': a training flag on a 'reasoning' part",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "ab", "train": False}],
                "train_detail": [{"begin_offset": 0, "end_offset": 0, "train": True}],
            },
            r"^r: field 'messages\[1\].content': training flags on its parts and a train_detail",
        ),
    ],
)
def test_part_flags_that_cannot_be_placed_are_refused(message, error):
    with pytest.raises(DataError, match=error):
        to_conversation({"messages": [{"role": "user", "content": "q"}, message]}, "r")


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (
            {"type": "image_url", "image_url": {"url": "x.png"}},
            r"^f, line 2: field 'messages\[0\].content\[1\]': a 'image_url' part; this model is text-only \(it has no "
            r"image processor\)",
        ),
        ({"type": "image"}, r"^f, line 2: field 'messages\[0\].content\[1\]': a 'image' part; this model is text-only"),
        (
            {"type": "input_audio", "input_audio": {}},
            r"field 'messages\[0\].content\[1\]': a 'input_audio' part; only text, reasoning and tool-call parts",
        ),
        ({"type": "text"}, r"field 'messages\[0\].content\[1\]': a 'text' part needs 'text' \(or 'value'\)"),
        ({"type": "text", "text": 5}, r"field 'messages\[0\].content\[1\].text' must be a string, got int"),
        ("plain", r"field 'messages\[0\].content\[1\]' must be a part object"),
    ],
)
def test_a_part_that_is_not_text_is_refused_in_one_line_naming_it(part, message):
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
            {"role": "assistant", "content": "A cat."},
        ]
    }
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "f, line 2")
    assert "\n" not in str(err.value)


def test_parts_that_join_to_nothing_are_an_empty_content():
    blank = [{"type": "text", "text": " "}]
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": blank}]}
    with pytest.raises(DataError, match=r"^r: field 'messages\[1\].content' is empty$"):
        to_conversation(record, "r")


# TRL's Idefics3 template: it writes each text part of a content list and renders a string content as nothing.
IDEFICS3 = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'].capitalize()}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def test_a_template_that_iterates_the_parts_gets_them_as_they_are(chatml_tokenizer, tmp_path):
    tokenizer = template_tokenizer(chatml_tokenizer, IDEFICS3)
    user = {"role": "user", "content": [{"type": "text", "text": "Tell me "}, {"type": "text", "value": "a joke"}]}
    answer = {"role": "assistant", "content": [{"type": "text", "text": "cats"}, {"type": "text", "text": "."}]}
    text = "<|begin_of_text|>User: Tell me a joke<end_of_utterance>\nAssistant: cats.<end_of_utterance>\n"
    reply = " cats.<end_of_utterance>"  # after the prompt "...Assistant:", what the model generates
    trained = [text.index(reply) <= i < text.index(reply) + len(reply) for i in range(len(text))]
    assert sample(build([{"messages": [user, answer]}], tokenizer, tmp_path)) == labels_of(tokenizer, text, trained)
    # The same words as strings render as nothing in this template: no content to train, refused.
    plain = {"messages": [{"role": "user", "content": "Tell me a joke"}, {"role": "assistant", "content": "cats."}]}
    with pytest.raises(TemplateError, match="changes the content of assistant turn 1"):
        build([plain], tokenizer, tmp_path / "plain")
