"""Any record to one conversation: which format reads it, what no format can honour, and the fields none read."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation, to_messages
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import build

CHAT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
SHAREGPT = [{"from": "human", "value": "sq"}, {"from": "gpt", "value": "sa"}]


@pytest.mark.parametrize(
    ("record", "read_as", "unused"),
    [
        (
            {"conversations": SHAREGPT, "messages": CHAT, "instruction": "i", "output": "o"},
            "sa",
            {"messages", "instruction", "output"},
        ),
        ({"messages": CHAT, "instruction": "i", "output": "o", "text": "t"}, "a", {"instruction", "output", "text"}),
        ({"instruction": "i", "output": "o", "prompt": "p", "completion": "c"}, "o", {"prompt", "completion"}),
        ({"prompt": CHAT[:1], "completion": CHAT[1:], "text": "t"}, "a", {"text"}),
        ({"completion": "c", "text": "t"}, None, {"completion"}),  # a completion alone is no TRL record
    ],
)
def test_a_record_is_read_by_the_first_format_it_holds_a_field_of(record, read_as, unused):
    """The order records are recognised in: ShareGPT, messages, alpaca, TRL prompt/completion, text."""
    conversation = to_conversation(record, "r")
    assert (conversation["messages"] or [{"content": None}])[-1]["content"] == read_as
    assert set(conversation["unused"]) == unused


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (  # LLaMA-Factory's kto_en_demo.json as it ships: messages with a desirable / undesirable verdict
            {"messages": CHAT, "label": True},
            r"^r: field 'label': unpaired preference data \(KTO\), not SFT",
        ),
        ({"prompt": "q", "completion": "a", "label": False}, r"^r: field 'label': unpaired preference data"),
        ({"prompt": "q", "chosen": "a", "rejected": "b"}, r"^r: field 'chosen' holds a preference pair"),
        ({"messages": CHAT, "images": ["x.png"]}, r"^r: field 'images' holds images \(multimodal"),
        ({"instruction": "q", "output": "a", "kto_tag": True}, r"^r: field 'kto_tag' holds a KTO label"),
        (["q", "a"], r"^r: expected a JSON object, got list$"),
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
    assert str(err.value).endswith("; found fields ['answer', 'question']")


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


def test_a_system_prompt_goes_first_unless_the_record_has_its_own():
    assert to_messages({"messages": CHAT}, "Be brief.")[0] == {"role": "system", "content": "Be brief."}
    own = [{"role": "system", "content": "Mine."}, *CHAT]
    assert to_messages({"messages": own}, "Be brief.") == own
