"""Bad records fail before training, naming the file, the line and the field."""

from __future__ import annotations

import json
import re
import tracemalloc

import pytest

from hf_lora_ds.data.formats import to_messages
from hf_lora_ds.data.records import DataError, iter_record_texts, load_records, records


def write_jsonl(tmp_path, lines: list[str]):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def first_error(path) -> str:
    with pytest.raises(DataError) as info:
        for record in load_records(path):
            to_messages(record.data, where=record.where)
    return str(info.value)


GOOD = json.dumps({"instruction": "1=", "output": "0 + 1"})


@pytest.mark.parametrize(
    "bad_line, pattern",
    [
        ('{"instruction": "1=", "output": ', r"train.jsonl, line 2: malformed JSON"),
        ('{"instruction": "1="}', r"train.jsonl, line 2: missing field 'output'"),
        ('{"question": "1=", "answer": "1"}', r"train.jsonl, line 2: missing field: .*'messages'.*--columns"),
        (
            '{"messages": [{"role": "robot", "content": "hi"}]}',
            r"line 2: field 'messages\[0\].role': unknown role 'robot'",
        ),
        (
            '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]}',
            r"line 2: field 'messages\[1\].content' is empty",
        ),
        ('{"instruction": "1=", "output": 1}', r"line 2: field 'output' must be a string, got int"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', r"line 2: field 'messages': no assistant turn"),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, '
            '{"role": "assistant", "content": "c"}]}',
            r"field 'messages\[1\].role': a system turn may only come first",
        ),
        ('["not", "an", "object"]', r"line 2: expected a JSON object, got list"),
    ],
)
def test_bad_jsonl_record_names_file_line_field(tmp_path, bad_line, pattern):
    message = first_error(write_jsonl(tmp_path, [GOOD, bad_line]))
    assert str(tmp_path / "train.jsonl") in message
    assert re.search(pattern, message), message


def test_json_array_errors_name_the_record_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n  {"instruction": "1=", "output": "0 + 1"},\n  {"instruction": "2=",\n   "output": null}\n]\n')
    assert first_error(path) == f"{path}, line 3 (record 1): missing field 'output'"
    path.write_text('[{"instruction": "1=", "output": "0 + 1"}, {"instruction": "2="}]')
    assert first_error(path) == f"{path}, line 1 (record 1): missing field 'output'"
    path.write_text('[\n  {"instruction": "1=", "output": "0 + 1"}\n  {"instruction": "2="}\n]\n')
    assert "line 3: malformed JSON" in first_error(path)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_json_array_read_in_chunks_keeps_records_lines_and_offsets(tmp_path, monkeypatch, chunk):
    """Chunk boundaries fall inside records, strings, multi-byte characters and the byte-order mark: the texts,
    lines and error locations are those of the whole file read at once."""
    monkeypatch.setattr(records, "_CHUNK", chunk)
    items = [{"instruction": f"{i}= café 東京", "output": f"{i} + 0"} for i in range(5)]
    body = "[\n" + ",\n".join("  " + json.dumps(item, ensure_ascii=False, indent=1) for item in items) + "\n]\n"
    path = tmp_path / "train.json"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    texts = list(iter_record_texts(path))
    assert [json.loads(text) for text, _ in texts] == items
    lines = [i + 1 for i, line in enumerate(body.splitlines()) if line.startswith("  {")]
    assert [where for _, where in texts] == [f"{path}, line {n} (record {i})" for i, n in enumerate(lines)]
    bad = body.replace('"3 + 0"', '"3 + 0",,')
    path.write_text(bad, encoding="utf-8")
    line = next(i + 1 for i, text in enumerate(bad.splitlines()) if ",," in text)
    assert f"line {line}: malformed JSON (Expecting property name" in first_error(path)
    raw = body.encode().replace("2= café".encode(), "2= café".encode("latin-1"))  # one byte that is not UTF-8
    path.write_bytes(raw)
    offset = raw.index(b"\xe9")
    line = raw.count(b"\n", 0, offset) + 1
    with pytest.raises(DataError, match=rf"{path}, line {line} \(byte offset {offset}\): not UTF-8 text \(byte 0xe9\)"):
        list(iter_record_texts(path))
    path.write_text(body.rstrip().removesuffix("]"), encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSON \(the array has no closing '\]'\)"):
        list(iter_record_texts(path))


def test_json_array_is_not_read_whole(tmp_path):
    """A 24 MB array is read with a few MB of Python memory: a chunk or two and a record, not the file."""
    path = tmp_path / "train.json"
    record = json.dumps({"instruction": "x " * 100, "output": "y " * 100})
    with path.open("w") as f:
        f.write("[" + ",\n".join([record] * 60_000) + "]")
    assert path.stat().st_size > 24_000_000
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_record_texts(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 60_000
    assert peak < 8_000_000, peak


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"data.csv: unsupported file type '.csv'"):
        load_records(tmp_path / "data.csv")


def test_blank_lines_are_skipped_and_lines_still_counted(tmp_path):
    path = write_jsonl(tmp_path, [GOOD, "", "   ", '{"instruction": 3, "output": "x"}'])
    assert "line 4: field 'instruction' must be a string" in first_error(path)


def test_system_prompt_only_added_when_missing():
    assert to_messages({"instruction": "q", "output": "a"}, system_prompt="S")[0] == {"role": "system", "content": "S"}
    record = {
        "messages": [
            {"role": "system", "content": "Mine"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        ]
    }
    assert to_messages(record, system_prompt="S")[0]["content"] == "Mine"


def test_a_json_file_holding_one_object_is_one_record(tmp_path):
    """axolotl's conversation fixture: one pretty-printed object in a .json file."""
    record = {"conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Bonjour!"}]}
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(record, indent=2))
    assert [(r.data, r.where) for r in load_records(path)] == [(record, f"{path}, line 1 (the file's one object)")]


def test_a_malformed_one_object_file_quotes_pythons_parser_on_the_whole_file(tmp_path):
    path = tmp_path / "conversation.json"
    path.write_text('{\n  "conversations": [\n    {"from": "human" "value": "Hello"}\n  ]\n}\n')
    with pytest.raises(DataError) as err:
        load_records(path)
    try:
        json.loads(path.read_text())
    except json.JSONDecodeError as parser:
        said = str(parser)
    assert str(err.value).startswith(f"{path}, line 3: malformed JSON (") and said in str(err.value)
    assert "line 3 column 22" in said


def test_json_lines_in_a_json_file_are_still_read_a_line_at_a_time(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(GOOD + "\n" + GOOD + "\n")
    assert [r.where for r in load_records(path)] == [f"{path}, line 1", f"{path}, line 2"]
