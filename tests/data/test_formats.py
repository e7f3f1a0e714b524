"""ShareGPT, tool-call and peer records: exact label vectors from hand-written pieces, and their errors."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.data.formats import to_conversation
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
            (
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
                False,
            ),
            ("Bonjour!<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert ds[0]["input_ids"] == input_ids
    assert ds[0]["labels"] == labels


def test_tool_call_conversation_trains_the_call_not_the_result(tools_tokenizer, tmp_path):
    ds = build([{"messages": TOOL_MESSAGES, "tools": [TOOL]}], tools_tokenizer, tmp_path)
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert ds[0]["input_ids"] == input_ids
    assert ds[0]["labels"] == labels


def test_openai_style_string_arguments_and_sharegpt_tools_give_the_same_sample(tools_tokenizer, tmp_path):
    string_args = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        TOOL_MESSAGES[0],
        {"role": "assistant", "content": None, "tool_calls": [string_args]},
        *TOOL_MESSAGES[2:],
    ]
    ds = build([{"messages": messages, "tools": [TOOL]}, SHAREGPT_TOOLS], tools_tokenizer, tmp_path)
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert [ds[0]["labels"], ds[1]["labels"]] == [labels, labels]
    assert ds[1]["input_ids"] == input_ids


def test_template_without_tool_support_is_refused(chatml_tokenizer, tmp_path):
    with pytest.raises(TemplateError, match="does not render the tool call 'get_weather' of assistant turn 1"):
        build([{"messages": TOOL_MESSAGES, "tools": [TOOL]}], chatml_tokenizer, tmp_path)


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
            {
                "messages": [
                    TOOL_MESSAGES[0],
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"city": Paris}'}}]},
                ]
            },
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
        ({"role": "user", "content": ["hi"]}, r"^r: field 'messages\[0\].content\[0\]' must be a part object"),
        ({"role": "user", "content": 3}, r"^r: field 'messages\[0\].content' must be a string, got int"),
        ({"role": "user", "content": " "}, r"^r: field 'messages\[0\].content' is empty$"),
        (
            {"role": "user", "content": "hi", "reasoning_content": "x"},
            r"^r: field 'messages\[0\].reasoning_content': only",
        ),
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


# ---- the peers' record kinds (TRL, LLaMA-Factory), from their documented formats ----

from tests.data.peer_records import END, chatml, expect, sample  # noqa: E402


def test_trl_conversational_prompt_completion_trains_the_completion_only(chatml_tokenizer, tmp_path):
    """TRL: the prompt (an earlier exchange included) is context; every assistant turn of the completion is trained."""
    record = {
        "prompt": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour!"},
            {"role": "user", "content": "Tell me a joke"},
        ],
        "completion": [
            {"role": "assistant", "content": "cats."},
            {"role": "user", "content": "1="},
            {"role": "assistant", "content": "0 + 1"},
        ],
    }
    text = chatml(
        ("user", "Hello"),
        ("assistant", "Bonjour!"),
        ("user", "Tell me a joke"),
        ("assistant", "cats."),
        ("user", "1="),
        ("assistant", "0 + 1"),
    )
    assert sample(build([record], chatml_tokenizer, tmp_path)) == expect(
        chatml_tokenizer, text, ["cats." + END, "0 + 1" + END]
    )
    last = build([record], chatml_tokenizer, tmp_path / "last", assistant_turns="last")
    assert sample(last) == expect(chatml_tokenizer, text, ["0 + 1" + END])


def test_trl_conversational_completion_with_tool_calls(tools_tokenizer, tmp_path):
    """A completion of several messages, a tool call and its result among them, trains as the messages record."""
    record = {"prompt": TOOL_MESSAGES[:1], "completion": TOOL_MESSAGES[1:], "tools": [TOOL]}
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert sample(build([record], tools_tokenizer, tmp_path)) == (input_ids, labels)


def test_llamafactory_alpaca_history_rounds_are_context_and_trained(chatml_tokenizer, tmp_path):
    """LLaMA-Factory's data README: history is [[query, answer], ...] of earlier rounds, whose answers are learnt."""
    record = {
        "instruction": "Tell me a joke",
        "input": "",
        "output": "cats.",
        "system": "Be brief.",
        "history": [["Hello", "Bonjour!"], ["1=", "0 + 1"]],
    }
    text = chatml(
        ("system", "Be brief."),
        ("user", "Hello"),
        ("assistant", "Bonjour!"),
        ("user", "1="),
        ("assistant", "0 + 1"),
        ("user", "Tell me a joke"),
        ("assistant", "cats."),
    )
    answers = ["Bonjour!" + END, "0 + 1" + END, "cats." + END]
    assert sample(build([record], chatml_tokenizer, tmp_path)) == expect(chatml_tokenizer, text, answers)
    last = build([record], chatml_tokenizer, tmp_path / "last", assistant_turns="last")
    assert sample(last) == expect(chatml_tokenizer, text, answers[-1:])


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"instruction": "q", "output": "a", "history": [["only a query"]]},
            r"^r: field 'history\[0\]' must be a \[query",
        ),
        ({"instruction": "q", "output": "a", "history": [["q", 3]]}, r"^r: field 'history\[0\]\[1\]' must be a string"),
        (
            {"prompt": [{"role": "user", "content": "q"}], "completion": "a"},
            r"^r: field 'completion' must be a list of messages like the prompt",
        ),
        (
            {"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]},
            r"^r: field 'completion' must be a string like the prompt",
        ),
        (
            {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "user", "content": "a"}]},
            r"^r: field 'completion': no assistant turn",
        ),
        (
            {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "system", "content": "a"}]},
            r"^r: field 'completion\[0\].role': a system turn may only come first",
        ),
        ({"prompt": "q"}, r"^r: a 'prompt' without a 'completion' \(TRL's prompt-only kind\)"),
        ({"prompt": "q", "completion": "a", "label": False}, r"^r: field 'label': unpaired preference data"),
        (  # LLaMA-Factory's kto_en_demo.json as it ships: messages with a desirable / undesirable verdict
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": True},
            r"^r: field 'label': unpaired preference data \(KTO\), not SFT",
        ),
        ({"prompt": "q", "chosen": "a", "rejected": "b"}, r"^r: field 'chosen' holds a preference pair"),
        (
            {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "images": ["x.png"],
            },
            r"^r: field 'images' holds images \(multimodal",
        ),
        ({"instruction": "q", "output": "a", "kto_tag": True}, r"^r: field 'kto_tag' holds a KTO label"),
    ],
)
def test_peer_records_that_cannot_be_trained_are_refused_in_one_line(record, message):
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "r")
    assert "\n" not in str(err.value)


def test_the_refusal_of_an_unknown_record_lists_every_accepted_kind():
    with pytest.raises(DataError) as err:
        to_conversation({"question": "q", "answer": "a"}, "r")
    for kind in (
        "'messages'",
        "'conversations' (ShareGPT)",
        "alpaca",
        "'history'",
        "'prompt' and 'completion' (TRL",
        "'text' (TRL language modeling)",
        "--columns prompt=question,response=answer",
    ):
        assert kind in str(err.value)


def test_unused_fields_and_message_keys_are_named_with_counts(chatml_tokenizer, tmp_path):
    records = [
        {"instruction": "1=", "output": "0 + 1", "id": 1},
        {"instruction": "12=", "output": "3 + 9", "id": 2, "source": "web"},
        {
            "messages": [
                {"role": "user", "content": "Hello", "name": "ann"},
                {"role": "assistant", "content": "Bonjour!", "name": "bot"},
            ],
            "system": "unread",
        },
        {"conversations": [{"from": "human", "value": "Hi", "lang": "en"}, {"from": "gpt", "value": "Yo"}]},
    ]
    dataset = build(records, chatml_tokenizer, tmp_path)
    assert dataset.unused_fields == {"conversations[].lang": 1, "id": 2, "messages[].name": 1, "source": 1, "system": 1}
    assert dataset.unused_note() == (
        "; unused fields: conversations[].lang (1 record), id (2 records), "
        "messages[].name (1 record), source (1 record), system (1 record)"
    )
    plain = build(records[:1] * 2, chatml_tokenizer, tmp_path / "b")
    assert build([{"instruction": "1=", "output": "0 + 1"}], chatml_tokenizer, tmp_path / "c").unused_note() == ""
    assert plain.unused_note() == "; unused fields: id (2 records)"


def test_null_message_keys_are_absent_ones_not_unused_fields():
    """Arrow sources give every message every key any message of the column has, null where it had none."""
    record = {
        "messages": [
            {"role": "user", "content": "q", "tool_call_id": None, "weight": None, "train_detail": None},
            {"role": "assistant", "content": "a", "name": "bot", "weight": None},
        ]
    }
    conversation = to_conversation(record, "r")
    assert conversation["unused"] == ["messages[].name"] and "flags" not in conversation
