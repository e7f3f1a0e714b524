"""TRL's prompt/completion records: the conversational kind's exact labels (the completion trained), the standard kind
as plain text, and their errors."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import (
    END,
    TOOL,
    TOOL_MESSAGES,
    build,
    chatml,
    expect,
    expected,
    labels_of,
    sample,
    tool_pieces,
)


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


def test_a_completion_turns_flag_is_read_at_its_place_after_the_prompt(chatml_tokenizer, tmp_path):
    """A completion message's ``train`` flag belongs to that message, counted after the prompt's messages: the
    switched-off answer (completion[0], the conversation's 4th message) gets no supervised token, the last answer
    is trained. Read at its index within the completion, the flag would land on the prompt's first (user) turn and
    the switched-off answer would be trained."""
    record = {
        "prompt": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour!"},
            {"role": "user", "content": "Tell me a joke"},
        ],
        "completion": [
            {"role": "assistant", "content": "cats.", "train": False},
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
    dataset = build([record], chatml_tokenizer, tmp_path)
    assert sample(dataset) == expect(chatml_tokenizer, text, ["0 + 1" + END])
    assert dataset.flag_counts["turns_off"] == 1


def test_a_completion_turns_train_detail_keeps_to_its_turn_after_the_prompt_and_a_system_prompt(
    chatml_tokenizer, tmp_path
):
    """A completion message's ``train_detail`` spans belong to that message, counted after the prompt's messages and
    after a ``--system_prompt`` put first: its switched-off words are not trained, the rest of the answer is.
    Indexed within the completion alone, or not moved past the system turn, they would land on a user turn and the
    whole answer would be trained."""
    answer = "cats and dogs."
    record = {
        "prompt": [{"role": "user", "content": "Tell me a joke"}],
        "completion": [
            {
                "role": "assistant",
                "content": answer,
                "train_detail": [{"begin_offset": 4, "end_offset": 12, "train": False}],  # " and dogs", inclusive
            }
        ],
    }
    text = chatml(("system", "Be brief."), ("user", "Tell me a joke"), ("assistant", answer))
    dataset = build([record], chatml_tokenizer, tmp_path, system_prompt="Be brief.")
    at = text.index(answer)
    trained = [at <= i < at + 4 or at + 13 <= i < at + len(answer + END) for i in range(len(text))]
    assert sample(dataset) == labels_of(chatml_tokenizer, text, trained)
    assert dataset.flag_counts["tokens_masked"] > 0


def test_trl_conversational_completion_with_tool_calls(tools_tokenizer, tmp_path):
    """A completion of several messages, a tool call and its result among them, trains as the messages record."""
    record = {"prompt": TOOL_MESSAGES[:1], "completion": TOOL_MESSAGES[1:], "tools": [TOOL]}
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert sample(build([record], tools_tokenizer, tmp_path)) == (input_ids, labels)


def test_the_completion_starts_after_the_prompt_and_a_system_prompt_put_first():
    record = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}
    assert to_conversation(record, "r")["completion_from"] == 1
    assert to_conversation(record, "r", system_prompt="Be brief.")["completion_from"] == 2


def test_standard_strings_are_plain_text_with_the_prompt_counted():
    record = {"prompt": "The quick", "completion": " fox.", "tools": "[{"}  # no chat: its tools are not read
    assert to_conversation(record, "r") == {
        "text": "The quick fox.",
        "prompt_chars": 9,
        "messages": None,
        "tools": None,
        "unused": [],
    }


@pytest.mark.parametrize(
    ("record", "message"),
    [
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
    ],
)
def test_bad_trl_records_are_refused_in_one_line(record, message):
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "r")
    assert "\n" not in str(err.value)
