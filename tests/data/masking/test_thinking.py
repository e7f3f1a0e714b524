"""Thinking-model chats on Qwen3's own template: labels equal an expectation written here segment by segment, by
hand from what the template writes, independent of how hf_lora_ds derives them."""

from __future__ import annotations

import json
import re

import pytest

from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.masking.template_probes import TemplateTraits
from hf_lora_ds.data.masking.thinking import ThinkingOptions, as_template_reads
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import expected

USER = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TWO_TURNS = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Bonjour!", "reasoning_content": "greet in French"},
    {"role": "user", "content": "Tell me a joke"},
    {"role": "assistant", "content": "cats.", "reasoning_content": "a short one"},
]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TOOL_SYSTEM = (
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOL, ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
TOOL_CONVERSATION = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "call the tool",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "it said sunny"},
    ],
    "tools": [TOOL],
}


def samples(records, tokenizer, tmp_path, **kwargs) -> list[tuple[list[int], list[int]]]:
    ds = ChatSFTDataset(records, tokenizer, cache_dir=tmp_path, **kwargs)
    return [(ds[i]["input_ids"], ds[i]["labels"]) for i in range(len(ds))]


def think(reasoning: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n"


@pytest.mark.parametrize("train_reasoning", [True, False])
def test_reasoning_trained_or_masked_and_inline_think_is_the_same(qwen3_tokenizer, tmp_path, train_reasoning):
    inline = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi!"}]
    field = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!", "reasoning_content": "hm"}]
    thinking = ThinkingOptions(train_reasoning=train_reasoning)
    got = samples([{"messages": inline}, {"messages": field}], qwen3_tokenizer, tmp_path, thinking=thinking)
    want = expected(
        qwen3_tokenizer,
        [(USER.format("Hello"), False), (think("hm"), train_reasoning), ("Hi!<|im_end|>", True), ("\n", False)],
    )
    assert got == [want, want]


@pytest.mark.parametrize("empty_think", ["mask", "train"])
def test_answer_without_reasoning_gets_the_empty_think_block(qwen3_tokenizer, tmp_path, empty_think):
    record = {"instruction": "12=", "output": "3 + 9"}
    got = samples([record], qwen3_tokenizer, tmp_path, thinking=ThinkingOptions(empty_think=empty_think))
    pieces = [
        (USER.format("12="), False),
        ("<think>\n\n</think>\n\n", empty_think == "train"),
        ("3 + 9<|im_end|>", True),
    ]
    assert got == [expected(qwen3_tokenizer, [*pieces, ("\n", False)])]


def test_reasoning_in_history_is_dropped_so_each_turn_trains_in_its_inference_context(qwen3_tokenizer, tmp_path):
    first = [(USER.format("Hello"), False), (think("greet in French") + "Bonjour!<|im_end|>", True), ("\n", False)]
    # The template drops turn 1's reasoning once a later user turn follows: that is the history inference shows.
    history = USER.format("Hello") + "Bonjour!<|im_end|>\n" + USER.format("Tell me a joke")
    second = [(history, False), (think("a short one") + "cats.<|im_end|>", True), ("\n", False)]
    assert samples([{"messages": TWO_TURNS}], qwen3_tokenizer, tmp_path) == [
        expected(qwen3_tokenizer, first),
        expected(qwen3_tokenizer, second),
    ]
    last = samples([{"messages": TWO_TURNS}], qwen3_tokenizer, tmp_path, assistant_turns="last")
    assert last == [expected(qwen3_tokenizer, second)]


@pytest.mark.parametrize("train_reasoning", [True, False])
def test_tool_calls_with_reasoning(qwen3_tokenizer, tmp_path, train_reasoning):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    result = "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    pieces = [
        (TOOL_SYSTEM + USER.format("Weather in Paris?"), False),
        (think("call the tool"), train_reasoning),
        (call, True),
        (result, False),
        (think("it said sunny"), train_reasoning),
        ("Sunny.<|im_end|>", True),
        ("\n", False),
    ]
    thinking = ThinkingOptions(train_reasoning=train_reasoning)
    assert samples([TOOL_CONVERSATION], qwen3_tokenizer, tmp_path, thinking=thinking) == [
        expected(qwen3_tokenizer, pieces)
    ]


def test_sharegpt_and_alpaca_columns_carry_reasoning(qwen3_tokenizer, tmp_path):
    messages = {"messages": TWO_TURNS[:2]}
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Bonjour!", "reasoning_content": "greet in French"},
        ]
    }
    alpaca = {"q": "Hello", "a": "Bonjour!", "thought": "greet in French"}
    options = FormatOptions.from_flags("prompt=q,response=a,reasoning=thought", None)
    got = samples([messages, sharegpt, alpaca], qwen3_tokenizer, tmp_path, formats=options)
    assert got[0] == got[1] == got[2]
    assert got[0][1].count(IGNORE_INDEX) < len(got[0][1]) - len(qwen3_tokenizer("Bonjour!<|im_end|>")["input_ids"])


def test_template_without_reasoning_support(chatml_tokenizer, tmp_path):
    with pytest.raises(TemplateError, match="does not render the reasoning .reasoning_content. of assistant turn 1"):
        samples([{"messages": TWO_TURNS[:2]}], chatml_tokenizer, tmp_path)
    # <think> written into the content of a non-thinking template's data is content, trained as written.
    inline = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi!"}]
    got = samples([{"messages": inline}], chatml_tokenizer, tmp_path, thinking=ThinkingOptions(train_reasoning=False))
    pieces = [(USER.format("Hello"), False), ("<think>\nhm\n</think>\n\nHi!<|im_end|>", True), ("\n", False)]
    assert got == [expected(chatml_tokenizer, pieces)]


@pytest.mark.parametrize(
    "message, error",
    [
        ({"role": "user", "content": "x", "reasoning_content": "r"}, "messages[0].reasoning_content': only assistant"),
        ({"role": "assistant", "content": "x", "reasoning_content": 3}, "messages[0].reasoning_content' must be a str"),
    ],
)
def test_bad_reasoning_fields_are_named(qwen3_tokenizer, tmp_path, message, error):
    with pytest.raises(DataError, match=re.escape(error)):
        samples([{"messages": [message, {"role": "assistant", "content": "y"}]}], qwen3_tokenizer, tmp_path)


def test_answers_go_into_the_tags_the_model_writes_and_train_detail_offsets_follow():
    """Where the template reads '<answer>' tags off history (Hunyuan's dense template), an answer is given them;
    an answer that has them already, and a tool-call turn, are left as they are."""
    traits = TemplateTraits(None, None, None, answer_tags=("<answer>\n", "\n</answer>"))
    tagged = "<answer>\nyes\n</answer>"
    conversation = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "the cat sat"},
            {"role": "assistant", "content": tagged},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        ],
        "detail": {1: [(4, 7, False)]},  # "cat"
    }
    messages = as_template_reads(conversation, traits, "r")
    assert [m["content"] for m in messages[1:]] == ["<answer>\nthe cat sat\n</answer>", tagged, ""]
    begin, end, _ = conversation["detail"][1][0]
    assert messages[1]["content"][begin:end] == "cat"
