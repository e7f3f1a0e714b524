"""--columns and --sharegpt_roles: a dataset's own names read as the known fields and speakers; errors name what the
user wrote."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.formats.columns import FormatOptions, parse_mapping
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import build


def test_sharegpt_role_names_can_be_mapped():
    record = {"conversations": [{"from": "person", "value": "Hi"}, {"from": "bot", "value": "Hello"}]}
    options = FormatOptions.from_flags(None, "person=user,bot=assistant")
    assert to_conversation(record, "r", options=options)["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]


def test_column_mapping_reads_other_layouts(chatml_tokenizer, tmp_path):
    options = FormatOptions.from_flags("prompt=question,response=answer", None)
    mapped = build([{"question": "12=", "answer": "15", "id": 7}], chatml_tokenizer, tmp_path / "a", formats=options)
    alpaca = build([{"instruction": "12=", "output": "15"}], chatml_tokenizer, tmp_path / "b")
    assert mapped[0] == alpaca[0]


@pytest.mark.parametrize(
    ("columns", "record", "message"),
    [
        (
            {"reasoning": "thought"},
            {"instruction": "q", "output": "a", "thought": ["a", "list"]},
            r"^r: field 'thought' must be a string, got list",
        ),
        (
            {"prompt": "question", "response": "answer"},
            {"question": "q", "answer": 3},
            r"^r: field 'answer' must be a string, got int",
        ),
        (
            {"messages": "dialog"},
            {"dialog": [{"role": "user", "content": 7}]},
            r"^r: field 'dialog\[0\].content' must be a string, got int",
        ),
        (
            {"conversations": "turns", "system": "persona"},
            {"turns": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "persona": 1},
            r"^r: field 'persona' must be a string, got int",
        ),
        (
            {"tools": "functions"},
            {"instruction": "q", "output": "a", "functions": "{"},
            r"^r: field 'functions' is not valid JSON",
        ),
    ],
    ids=["reasoning", "response", "messages", "sharegpt-system", "tools"],
)
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


def test_a_column_mapped_field_that_goes_unused_is_named_as_the_user_wrote_it():
    options = FormatOptions(columns={"system": "persona"})
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "persona": "p"}
    assert to_conversation(record, "r", options=options)["unused"] == ["persona"]


def test_a_half_mapped_trl_record_is_told_both_ways_to_read_it():
    options = FormatOptions.from_flags("response=completion", None)
    told = r"read as it is without --columns, or as a chat turn with --columns prompt=prompt,response=completion"
    with pytest.raises(DataError, match=r"^r: missing field 'instruction' \(alpaca\); a TRL .* " + told):
        to_conversation({"prompt": "1=", "completion": "0 + 1"}, "r", options=options)
