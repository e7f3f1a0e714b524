"""Alpaca records with LLaMA-Factory's history: exact label vectors from the ChatML text, and their errors."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import END, build, chatml, expect, sample


def test_alpaca_input_joins_the_instruction_and_reasoning_goes_to_the_answer():
    record = {"instruction": "Translate", "input": "good morning", "output": "Bonjour", "reasoning": "French."}
    assert to_conversation(record, "r")["messages"] == [
        {"role": "user", "content": "Translate\ngood morning"},
        {"role": "assistant", "content": "Bonjour", "reasoning_content": "French."},
    ]


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
        ({"instruction": "q", "output": "a", "history": "q"}, r"^r: field 'history' must be a list of \[query"),
        ({"output": "a"}, r"^r: missing field 'instruction'$"),
        ({"instruction": "q", "output": " "}, r"^r: field 'output' is empty$"),
    ],
)
def test_bad_alpaca_records_are_refused_in_one_line(record, message):
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "r")
    assert "\n" not in str(err.value)
