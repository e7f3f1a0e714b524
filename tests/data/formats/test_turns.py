"""The one validator of turns: a bad turn gets one message whatever the other turns hold; what it gathers besides."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.formats.columns import FieldNames, FormatOptions
from hf_lora_ds.data.formats.turns import Reading
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import TOOL, TOOL_MESSAGES


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


def test_a_reading_names_a_field_as_the_user_wrote_it_and_gathers_flags_by_message_index():
    reading = Reading("f.jsonl, line 2", FieldNames(q="question"), FormatOptions())
    with pytest.raises(DataError, match=r"^f.jsonl, line 2: field 'question' is empty$"):
        reading.string({"q": " "}, "q")
    assert reading.string({"a": ""}, "a", required=False, allow_empty=True) == ""
    reading.offset = 1  # a list that continues a conversation, as a TRL completion does
    detail = [{"begin_offset": 0, "end_offset": 0, "train": False}]
    turns = [
        {"role": "user", "content": "q", "train": True, "lang": "en"},
        {"role": "assistant", "content": "ab", "train_detail": detail},
    ]
    read = reading.messages(turns, "turns")
    assert read == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ab"}]
    reading.shift(1)
    assert reading.fields() == {"flags": {2: True}, "detail": {3: [(0, 1, False)]}}
    assert reading.unused == ["turns[].lang"]


def test_a_flagged_empty_text_part_switches_nothing_and_is_accepted():
    """An empty text part covers no character: its flag gives no ``train_detail`` span (one would end before it
    begins and the record be refused), while the flags of the parts beside it are kept."""
    parts = [{"type": "text", "text": "", "train": False}, {"type": "text", "text": "Hi", "train": True}]
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": parts}]}
    conversation = to_conversation(record, "r")
    assert conversation["messages"][1]["content"] == "Hi"
    assert conversation["detail"] == {1: [(0, 2, True)]}
