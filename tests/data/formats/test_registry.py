"""The record-format registry: a user's own format registers as an eval task does, is recognised after the built-ins,
trains with exact labels, is refused naming its file, line and field, and keys the tokenized cache with its code."""

from __future__ import annotations

import importlib.util
import json

import pytest

from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.data.formats import (
    FormatOptions,
    RecordFormat,
    available_formats,
    register_format,
    to_conversation,
)
from hf_lora_ds.data.formats.registry import accepted_kinds
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import END, build, chatml, expect, sample

BUILT_IN = ["sharegpt", "messages", "alpaca", "prompt_completion", "text"]


def qa(record, reading):
    """A user's own format: a question, an optional context before it, and the answer."""
    question = reading.string(record, "q")
    context = reading.string(record, "context", required=False, allow_empty=True)
    user = f"{context}\n{question}" if context else question
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reading.string(record, "a")}]
    }


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_the_built_in_formats_in_the_order_records_are_recognised_in():
    assert available_formats() == BUILT_IN


def test_a_users_format_trains_from_a_file_with_exact_labels(chatml_tokenizer, tmp_path, own_formats):
    assert register_format(fields=("q", "a"), reads=("context",))(qa) is qa  # a decorator that returns what it took
    path = write_jsonl(
        tmp_path / "qa.jsonl", [{"q": "1=", "a": "0 + 1", "id": 7}, {"q": "2=", "a": "1 + 1", "context": "Sum."}]
    )
    dataset = ChatSFTDataset(path, chatml_tokenizer, cache_dir=tmp_path / "cache")
    assert available_formats() == [*BUILT_IN, "qa"]
    assert sample(dataset, 0) == expect(
        chatml_tokenizer, chatml(("user", "1="), ("assistant", "0 + 1")), ["0 + 1" + END]
    )
    second = chatml(("user", "Sum.\n2="), ("assistant", "1 + 1"))
    assert sample(dataset, 1) == expect(chatml_tokenizer, second, ["1 + 1" + END])
    assert dataset.unused_note() == "; unused fields: id (1 record)"  # context is read, id is not


def test_a_bad_record_of_a_users_format_names_its_file_line_and_field(chatml_tokenizer, tmp_path, own_formats):
    register_format(qa, fields=("q", "a"))
    path = write_jsonl(tmp_path / "qa.jsonl", [{"q": "1=", "a": "0 + 1"}, {"q": " ", "a": "1 + 1"}])
    with pytest.raises(DataError, match=r"^\S+qa.jsonl, line 2: field 'q' is empty$"):
        ChatSFTDataset(path, chatml_tokenizer, cache_dir=tmp_path / "cache")
    # A column mapped by --columns is named as the user wrote it, as for the built-ins.
    options = FormatOptions(columns={"q": "question"})
    with pytest.raises(DataError, match=r"^r: field 'question' must be a string, got int"):
        to_conversation({"question": 3, "a": "x"}, "r", options=options)


def test_what_a_users_converter_makes_is_validated_as_the_built_ins_turns_are(own_formats):
    @register_format(name="bot", fields=("ask",))
    def bot_turns(record, reading):
        return {"messages": [{"role": "user", "content": record["ask"]}, {"role": "bot", "content": "x"}]}

    with pytest.raises(DataError, match=r"^f, line 4 \(format 'bot'\): field 'messages\[1\].role': unknown role 'bot'"):
        to_conversation({"ask": "q"}, "f, line 4")
    register_format(lambda record, reading: [record["ask"]], name="bot", fields=("ask",), overwrite=True)
    with pytest.raises(TypeError, match=r"record format 'bot' returned list; a converter returns"):
        to_conversation({"ask": "q"}, "r")


def test_a_users_format_may_give_plain_text_with_its_prompt_counted(own_formats):
    def pc2(record, reading):
        return {"text": record["p"] + record["c"], "prompt_chars": record.get("n", len(record["p"]))}

    register_format(pc2, fields=("p", "c"), reads=("n",))
    assert to_conversation({"p": "a", "c": "bc"}, "r") == {
        "text": "abc",
        "prompt_chars": 1,
        "messages": None,
        "tools": None,
        "unused": [],
    }
    with pytest.raises(DataError, match=r"^r \(format 'pc2'\): 'prompt_chars' must be a character count"):
        to_conversation({"p": "a", "c": "b", "n": 3}, "r")


def test_a_name_clash_is_refused_unless_overwrite_which_keeps_the_place(own_formats):
    with pytest.raises(ValueError, match="a record format named 'alpaca' is already registered; pick another name"):
        register_format(qa, name="alpaca", fields=("instruction", "output"))
    assert to_conversation({"instruction": "i", "output": "o"}, "r")["messages"][0]["content"] == "i"
    register_format(qa, name="alpaca", fields=("q", "a"), overwrite=True)
    assert available_formats() == BUILT_IN
    assert to_conversation({"q": "1=", "a": "0 + 1"}, "r")["messages"][0]["content"] == "1="
    with pytest.raises(DataError, match=r"^r: missing field: a record needs "):
        to_conversation({"instruction": "i", "output": "o"}, "r")


def test_a_users_format_is_recognised_after_the_built_ins_and_named_in_the_refusal(own_formats):
    register_format(RecordFormat("qa", fields=("q", "a"), convert=qa, describe="'q' and 'a' (our quiz)"))
    assert to_conversation(
        {"messages": [{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"}], "q": "1"}, "r"
    )["unused"] == ["q"]
    assert accepted_kinds().startswith("'conversations' (ShareGPT), ")
    assert "'text' (TRL language modeling), or 'q' and 'a' (our quiz); other column names" in accepted_kinds()
    with pytest.raises(DataError, match=r"or 'q' and 'a' \(our quiz\); .*; found fields \['z'\]$"):
        to_conversation({"z": 1}, "r")
    with pytest.raises(ValueError, match=r"--columns x=y: unknown field 'x'; map one of \[.*'q', 'query'"):
        FormatOptions(columns={"x": "y"})


def test_a_record_format_needs_a_name_and_fields(own_formats):
    with pytest.raises(ValueError, match="a record format needs a name and the fields"):
        register_format(qa)
    with pytest.raises(TypeError, match="register_format takes a RecordFormat or a converter function, got str"):
        register_format("qa", fields=("q",))


def test_editing_a_users_converter_tokenizes_the_data_again(chatml_tokenizer, tmp_path, own_formats):
    """The tokenized cache is keyed by the source of the module that defines a format's converter."""
    module_path = tmp_path / "my_formats.py"
    source = (
        "def qa(record, reading):\n"
        "    turns = [{'role': 'user', 'content': record['q']}, {'role': 'assistant', 'content': ANSWER}]\n"
        "    return {'messages': turns}\n"
    )
    records = [{"q": "1="}]
    for answer in ("0 + 1", "1 + 0"):
        module_path.write_text(f"ANSWER = {answer!r}\n{source}")
        spec = importlib.util.spec_from_file_location("my_formats", module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        register_format(module.qa, fields=("q",), overwrite=True)
        text = chatml(("user", "1="), ("assistant", answer))
        assert sample(build(records, chatml_tokenizer, tmp_path / "cache")) == expect(
            chatml_tokenizer, text, [answer + END]
        )
