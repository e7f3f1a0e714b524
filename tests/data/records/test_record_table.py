"""Records read into Arrow and tokenized by a (multi-process) datasets map: the same samples, the same error
locations, and a second run served from the cache."""

from __future__ import annotations

import io
import json

import pytest

from hf_lora_ds.data import dataset
from hf_lora_ds.data.dataset import ChatSFTDataset, labels_from_spans, render_samples
from hf_lora_ds.data.formats import FormatOptions, to_conversation
from hf_lora_ds.data.records import DataError, record_table
from hf_lora_ds.data.sources import load_data
from tests.data.peer_records import SHAREGPT_TOOLS, TOOL, TOOL_MESSAGES

MIXED = [
    {"instruction": "12=", "input": "", "output": "王大丫丫的回答是--->3 + 9"},
    {"instruction": "Add", "input": "1=", "output": "0 + 1", "system": "Be brief."},
    {
        "messages": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour!"},
            {"role": "user", "content": "Tell me a joke"},
            {"role": "assistant", "content": "cats."},
        ]
    },
    SHAREGPT_TOOLS,
    {"messages": TOOL_MESSAGES, "tools": [TOOL]},
]


def write_jsonl(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def alpaca_lines(n: int) -> list[str]:
    return [json.dumps({"instruction": f"{i}=", "output": f"{i} + 0"}) for i in range(n)]


def reference(tokenizer, record: dict) -> tuple[list[int], list[int]]:
    """One record's ids and labels computed directly, with no datasets map and no Arrow table."""
    conversation = to_conversation(record, "record")
    [sample] = render_samples(tokenizer, conversation["messages"], tools=conversation["tools"])
    text, spans = sample.text, sample.spans
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    return ids, labels_from_spans(tokenizer, text, spans, encoded["offset_mapping"], ids)


@pytest.mark.parametrize("num_proc", [1, 2])
def test_arrow_path_gives_the_exact_samples(tools_tokenizer, tmp_path, num_proc):
    path = write_jsonl(tmp_path / "mixed.jsonl", [json.dumps(r, ensure_ascii=False) for r in MIXED * 3])
    ds = ChatSFTDataset(path, tools_tokenizer, cache_dir=tmp_path / "cache", num_proc=num_proc)
    assert [(s["input_ids"], s["labels"]) for s in ds] == [reference(tools_tokenizer, r) for r in MIXED * 3]
    assert len(ds.samples.cache_files) == num_proc  # one tokenized shard per worker
    written = sorted(p.name for p in (tmp_path / "cache").glob("*.arrow"))
    assert len(written) == num_proc and all(name.startswith("chat_sft-") for name in written)  # validation writes none
    assert ds.samples.with_format(None)["where"] == [f"{path}, line {i}" for i in range(1, 16)]
    features = ds.samples.features  # compact columns
    dtypes = [features[name].feature.dtype for name in ("input_ids", "attention_mask", "labels")]
    assert dtypes == ["int32", "int8", "int32"]


@pytest.mark.parametrize("num_proc", [1, 2])
@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"instruction": "x"}', "line 290: missing field 'output'"),
        ('{"instruction": "x", "output": ', "line 290: malformed JSON (Expecting value at column 32)"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "line 290: field 'messages': no assistant turn"),
    ],
)
def test_bad_record_near_the_end_is_named_by_file_and_line(
    chatml_tokenizer, tmp_path, monkeypatch, num_proc, bad_line, message
):
    lines = alpaca_lines(300)
    lines[289] = bad_line
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    rendered = []
    monkeypatch.setattr(dataset._Encoder, "sample_lists", lambda self, conversations: rendered.append(conversations))
    with pytest.raises(DataError) as err:
        ChatSFTDataset(path, chatml_tokenizer, cache_dir=tmp_path / "cache", num_proc=num_proc)
    assert str(err.value).startswith(f"{path}, {message}")
    assert rendered == []  # found by the validation pass, before any record was rendered or tokenized


@pytest.mark.parametrize("good_lines", [0, 2])
def test_bad_bytes_are_named_by_line_and_offset(chatml_tokenizer, tmp_path, good_lines):
    path = tmp_path / "train.jsonl"
    lines = alpaca_lines(good_lines)
    good = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(b"\xef\xbb\xbf" + good + '{"instruction": "café"}'.encode("latin-1"))  # after a byte-order mark
    offset = 3 + len(good) + len('{"instruction": "caf')
    line = good_lines + 1
    with pytest.raises(
        DataError, match=rf"^{path}, line {line} \(byte offset {offset}\): not UTF-8 text \(byte 0xe9\)"
    ):
        ChatSFTDataset(str(path), chatml_tokenizer, cache_dir=tmp_path / "cache")


def test_second_run_is_served_from_the_cache(chatml_tokenizer, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "train.jsonl", alpaca_lines(50))
    first = ChatSFTDataset(path, chatml_tokenizer, cache_dir=tmp_path / "cache", num_proc=2)
    calls = {"read": 0, "validated": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(record_table, "iter_record_texts", counting("read", record_table.iter_record_texts))
    monkeypatch.setattr(dataset, "to_conversation", counting("validated", dataset.to_conversation))
    second = ChatSFTDataset(path, chatml_tokenizer, cache_dir=tmp_path / "cache", num_proc=2)
    assert calls == {"read": 0, "validated": 0}
    assert second.samples.cache_files == first.samples.cache_files
    assert [s for s in second] == [s for s in first]
    # A changed file is read and tokenized again, and its locations are its own.
    write_jsonl(tmp_path / "train.jsonl", alpaca_lines(50)[:10] + ['{"instruction": "x"}'])
    with pytest.raises(DataError, match=r"train.jsonl, line 11: missing field 'output'"):
        ChatSFTDataset(path, chatml_tokenizer, cache_dir=tmp_path / "cache")
    assert calls["read"] == 1


def test_every_setting_keys_the_cache(chatml_tokenizer, tmp_path):
    path = write_jsonl(
        tmp_path / "train.jsonl",
        [json.dumps({"conversations": [{"from": "human", "value": "1="}, {"from": "bot", "value": "0 + 1"}]})],
    )
    cache = tmp_path / "cache"
    as_assistant = ChatSFTDataset(
        path, chatml_tokenizer, cache_dir=cache, formats=FormatOptions({}, {"bot": "assistant"})
    )
    with_system = ChatSFTDataset(
        path,
        chatml_tokenizer,
        cache_dir=cache,
        system_prompt="Be brief.",
        formats=FormatOptions({}, {"bot": "assistant"}),
    )
    assert with_system[0]["input_ids"] != as_assistant[0]["input_ids"]
    with pytest.raises(DataError, match="no assistant turn"):
        ChatSFTDataset(path, chatml_tokenizer, cache_dir=cache, formats=FormatOptions({}, {"bot": "user"}))


def test_records_are_a_memory_mapped_table(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", alpaca_lines(5))
    loaded = load_data(path, cache_dir=tmp_path / "cache")
    assert loaded.table.cache_files and str(tmp_path / "cache") in loaded.table.cache_files[0]["filename"]
    assert loaded.records[4].data == {"instruction": "4=", "output": "4 + 0"}
    assert [r.where for r in loaded.records[3:]] == [f"{path}, line 4", f"{path}, line 5"]


def test_image_bytes_and_pil_images_survive_the_record_table_as_data_uris(tmp_path):
    """A Hub or save_to_disk dataset's ``datasets.Image`` column reaches the conversation as the bytes it stores (a
    JPEG stays that JPEG, never decoded and written again), and a PIL image given in code as the same pixels, not as
    the text of their repr."""
    import datasets
    from PIL import Image

    red = Image.new("RGB", (3, 2), "red")
    jpeg = io.BytesIO()
    red.save(jpeg, format="JPEG")
    chat = [{"role": "user", "content": "<image>?"}, {"role": "assistant", "content": "red"}]
    features = datasets.Features(
        {
            "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
            "images": datasets.List(datasets.Image()),
        }
    )
    rows = {"messages": [chat], "images": [[{"bytes": jpeg.getvalue(), "path": "red.jpg"}]]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
    (row,) = load_data(str(tmp_path / "saved"), cache_dir=tmp_path).records
    assert to_conversation(row.data, row.where, images=True)["images"] == [
        {"bytes": jpeg.getvalue(), "path": "red.jpg"}
    ]
    (row,) = load_data([{"messages": chat, "images": [red]}]).records
    (image,) = to_conversation(row.data, row.where, images=True)["images"]
    assert Image.open(io.BytesIO(image["bytes"])).convert("RGB").tobytes() == red.tobytes()
