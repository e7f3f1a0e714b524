"""TRL's language-modeling records: one text, read as plain text (its tokenizing is
tests/data/masking/test_plain_text.py's)."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.records import DataError


def test_a_text_record_is_plain_text_all_of_it_trained():
    assert to_conversation({"text": "The quick fox.", "id": 3}, "r") == {
        "text": "The quick fox.",
        "prompt_chars": 0,
        "messages": None,
        "tools": None,
        "unused": ["id"],
    }


def test_a_system_prompt_leaves_plain_text_alone():
    assert to_conversation({"text": "abc"}, "r", system_prompt="Be brief.")["text"] == "abc"


@pytest.mark.parametrize(
    ("record", "message"),
    [({"text": " "}, r"^r: field 'text' is empty$"), ({"text": 4}, r"^r: field 'text' must be a string, got int")],
)
def test_a_bad_text_is_refused_naming_the_field(record, message):
    with pytest.raises(DataError, match=message):
        to_conversation(record, "r")
