"""ShareGPT, tool-call and column-mapped records: exact label vectors from hand-written pieces, and their errors."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.data.formats import FormatOptions, parse_mapping, to_conversation
from hf_lora_ds.data.records import DataError

SYSTEM = "You are a helpful assistant."
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"city": {"type": "string"}}}}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_MESSAGES = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
]
SHAREGPT_TOOLS = {
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "sunny"},
        {"from": "gpt", "value": "It is sunny."},
    ],
    "tools": json.dumps([TOOL]),
}


def expected(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Token ids and labels of a text given as (piece, trained?) pairs, tokenized piece by piece."""
    input_ids, labels = [], []
    for text, trained in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids += piece
        labels += piece if trained else [IGNORE_INDEX] * len(piece)
    return input_ids, labels


def build(records, tokenizer, tmp_path, **kwargs):
    return ChatSFTDataset(records, tokenizer, cache_dir=tmp_path, **kwargs)


def tool_pieces() -> list[tuple[str, bool]]:
    """The tool conversation as the Qwen2.5-like template renders it: the call and the answer trained, the tool
    result (a user turn of <tool_response>) not."""
    return [
        (f"<|im_start|>system\n{SYSTEM}\n\n# Tools\n<tools>\n{json.dumps(TOOL)}\n</tools><|im_end|>\n", False),
        ("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n", False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>', True),
        ("\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n", False),
        ("It is sunny.<|im_end|>", True),
        ("\n", False),
    ]


def test_sharegpt_with_system_exact_labels(chatml_tokenizer, tmp_path):
    record = {
        "system": "Be brief.",
        "conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Bonjour!"}],
    }
    ds = build([record], chatml_tokenizer, tmp_path)
    input_ids, labels = expected(
        chatml_tokenizer,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", False),
            ("Bonjour!<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert ds[0]["input_ids"] == input_ids
    assert ds[0]["labels"] == labels


def test_sharegpt_role_names_can_be_mapped():
    record = {"conversations": [{"from": "person", "value": "Hi"}, {"from": "bot", "value": "Hello"}]}
    options = FormatOptions.from_flags(None, "person=user,bot=assistant")
    assert to_conversation(record, "r", options=options)["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]


def test_tool_call_conversation_trains_the_call_not_the_result(tools_tokenizer, tmp_path):
    ds = build([{"messages": TOOL_MESSAGES, "tools": [TOOL]}], tools_tokenizer, tmp_path)
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert ds[0]["input_ids"] == input_ids
    assert ds[0]["labels"] == labels


def test_openai_style_string_arguments_and_sharegpt_tools_give_the_same_sample(tools_tokenizer, tmp_path):
    string_args = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [TOOL_MESSAGES[0], {"role": "assistant", "content": None, "tool_calls": [string_args]}, *TOOL_MESSAGES[2:]]
    ds = build([{"messages": messages, "tools": [TOOL]}, SHAREGPT_TOOLS], tools_tokenizer, tmp_path)
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert [ds[0]["labels"], ds[1]["labels"]] == [labels, labels]
    assert ds[1]["input_ids"] == input_ids


def test_template_without_tool_support_is_refused(chatml_tokenizer, tmp_path):
    with pytest.raises(TemplateError, match="does not render the tool call 'get_weather' of assistant turn 1"):
        build([{"messages": TOOL_MESSAGES, "tools": [TOOL]}], chatml_tokenizer, tmp_path)


def test_column_mapping_reads_other_layouts(chatml_tokenizer, tmp_path):
    options = FormatOptions.from_flags("prompt=question,response=answer", None)
    mapped = build([{"question": "12=", "answer": "15", "id": 7}], chatml_tokenizer, tmp_path / "a", formats=options)
    alpaca = build([{"instruction": "12=", "output": "15"}], chatml_tokenizer, tmp_path / "b")
    assert mapped[0] == alpaca[0]


@pytest.mark.parametrize(
    "record, message",
    [
        (
            {"conversations": [{"from": "robot", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
            r"^src, line 3: field 'conversations\[0\].from': unknown speaker 'robot'; use one of .* --sharegpt_roles",
        ),
        (
            {"conversations": [{"from": "human", "value": "Hi"}, {"from": "function_call", "value": "{get_weather"}]},
            r"^src, line 3: field 'conversations\[1\].value': tool call is not valid JSON",
        ),
        (
            {"messages": [TOOL_MESSAGES[0], {"role": "assistant", "tool_calls": [
                {"function": {"name": "f", "arguments": '{"city": Paris}'}}]}]},
            r"^src, line 3: field 'messages\[1\].tool_calls\[0\].function.arguments': tool call is not valid JSON",
        ),
        (
            {"messages": [TOOL_MESSAGES[0], {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]},
            r"^src, line 3: field 'messages\[1\].tool_calls\[0\].function.name' must be a non-empty string",
        ),
        (
            {"messages": TOOL_MESSAGES[:1], "tools": [TOOL]},
            r"^src, line 3: field 'messages': no assistant turn",
        ),
        (
            {"system": "Be brief.", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": " "}]},
            r"^src, line 3: field 'conversations\[1\].value' is empty$",
        ),
        (
            {"messages": TOOL_MESSAGES, "tools": "[{"},
            r"^src, line 3: field 'tools' is not valid JSON",
        ),
    ],
)
def test_bad_records_name_source_record_and_field(record, message):
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "src, line 3")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "bad_turn, message",
    [
        ({"role": None, "content": "hi"}, r"^r: missing field 'messages\[0\].role'$"),
        ({"role": 3, "content": "hi"}, r"^r: field 'messages\[0\].role' must be a string, got int"),
        ({"role": "robot", "content": "hi"}, r"^r: field 'messages\[0\].role': unknown role 'robot'"),
        ({"role": "user"}, r"^r: missing field 'messages\[0\].content'$"),
        ({"role": "user", "content": ["hi"]}, r"^r: field 'messages\[0\].content' must be a string, got list"),
        ({"role": "user", "content": " "}, r"^r: field 'messages\[0\].content' is empty$"),
        ({"role": "user", "content": "hi", "reasoning_content": "x"}, r"^r: field 'messages\[0\].reasoning_content': only"),
    ],
)
@pytest.mark.parametrize("later_turns", ["plain", "tool calls", "tools listed"])
def test_a_bad_turn_gets_one_message_whatever_the_other_turns_hold(bad_turn, message, later_turns):
    """One validator: a record whose other turns make tool calls (or that lists tools) is not checked by other rules."""
    rest = {"plain": [{"role": "assistant", "content": "Yo"}], "tool calls": TOOL_MESSAGES[1:]}
    record = {"messages": [bad_turn, *rest.get(later_turns, rest["plain"])]}
    if later_turns == "tools listed":
        record["tools"] = [TOOL]
    with pytest.raises(DataError, match=message):
        to_conversation(record, "r")


@pytest.mark.parametrize(
    ("columns", "record", "message"),
    [
        ({"reasoning": "thought"}, {"instruction": "q", "output": "a", "thought": ["a", "list"]},
         r"^r: field 'thought' must be a string, got list"),
        ({"prompt": "question", "response": "answer"}, {"question": "q", "answer": 3},
         r"^r: field 'answer' must be a string, got int"),
        ({"messages": "dialog"}, {"dialog": [{"role": "user", "content": ["hi"]}]},
         r"^r: field 'dialog\[0\].content' must be a string, got list"),
        ({"conversations": "turns", "system": "persona"}, {"turns": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "persona": 1},
         r"^r: field 'persona' must be a string, got int"),
        ({"tools": "functions"}, {"instruction": "q", "output": "a", "functions": "{"},
         r"^r: field 'functions' is not valid JSON"),
    ],
    ids=["reasoning", "response", "messages", "sharegpt-system", "tools"],
)  # fmt: skip
def test_a_bad_value_in_a_mapped_column_names_the_users_column(columns, record, message):
    with pytest.raises(DataError, match=message):
        to_conversation(record, "r", options=FormatOptions(columns=columns))


def test_mapped_column_missing_and_bad_flags():
    options = FormatOptions(columns={"prompt": "question", "response": "answer"})
    with pytest.raises(DataError, match=r"^r: missing field 'question' \(mapped to prompt by --columns\)"):
        to_conversation({"answer": "x"}, "r", options=options)
    # Half mapped: the user's missing column is named, not the 'output' it would have become.
    with pytest.raises(DataError, match=r"^r: missing field 'answer' \(mapped to response by --columns\)"):
        to_conversation({"question": "q", "reply": "a"}, "r", options=options)
    assert to_conversation({"instruction": "q", "output": "a"}, "r", options=options)["messages"][-1]["content"] == "a"
    with pytest.raises(ValueError, match="--columns answer=x: unknown field 'answer'"):
        FormatOptions(columns={"answer": "x"})
    with pytest.raises(ValueError, match="--sharegpt_roles bot=robot: unknown role 'robot'"):
        FormatOptions(sharegpt_roles={"bot": "robot"})
    with pytest.raises(ValueError, match="expected comma-separated key=value pairs, got 'prompt'"):
        parse_mapping("prompt", "--columns")
