"""Sources (save_to_disk directories, shard folders, Hub ids) and weighted mixtures, all built locally."""

from __future__ import annotations

import json
from collections import Counter

import datasets
import pytest

from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.sources import Source, load_data, parse_sources, sources


def alpaca(n: int, tag: str) -> list[dict]:
    return [{"instruction": f"{tag} {i}=", "output": f"{tag}{i}"} for i in range(n)]


def write_jsonl(path, records) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def outputs(loaded) -> list[str]:
    return [r.data["output"] for r in loaded.records]


def test_save_to_disk_dataset_and_dataset_dict(tmp_path, chatml_tokenizer):
    records = alpaca(3, "a")
    datasets.Dataset.from_list(records).save_to_disk(tmp_path / "ds")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records)}).save_to_disk(tmp_path / "dd")
    for location in (tmp_path / "ds", tmp_path / "dd"):
        loaded = load_data(str(location)).records
        assert [r.data for r in loaded] == records
        assert loaded[2].where == f"{location}, row 2"
    from_disk = ChatSFTDataset(str(tmp_path / "ds"), chatml_tokenizer, cache_dir=tmp_path / "c1")
    from_list = ChatSFTDataset(records, chatml_tokenizer, cache_dir=tmp_path / "c2")
    assert [from_disk[i] for i in range(3)] == [from_list[i] for i in range(3)]


def test_rows_past_the_first_map_batch_keep_their_index(tmp_path, chatml_tokenizer):
    """More rows than one datasets.map batch (1,000): a row's location is its index in the dataset, not its place in
    the batch (row 1200 reported as "row 200"), in the record table and in a bad field's message."""
    records = alpaca(2500, "a")
    records[1200]["output"] = None  # a null column: the field is absent
    location = tmp_path / "ds"
    datasets.Dataset.from_list(records).save_to_disk(location)
    loaded = load_data(str(location)).records
    assert [loaded[i].where for i in (0, 999, 1000, 2499)] == [f"{location}, row {i}" for i in (0, 999, 1000, 2499)]
    with pytest.raises(DataError, match=f"^{location}, row 1200: missing field 'output'$"):
        ChatSFTDataset(str(location), chatml_tokenizer, cache_dir=tmp_path / "cache")


def test_folder_of_shards_keeps_file_and_line(tmp_path, chatml_tokenizer):
    write_jsonl(tmp_path / "shards" / "a.jsonl", alpaca(2, "a"))
    datasets.Dataset.from_list(alpaca(2, "b")).to_parquet(str(tmp_path / "shards" / "sub" / "b.parquet"))
    write_jsonl(tmp_path / "shards" / "c.jsonl", [alpaca(1, "c")[0], {"instruction": "x"}])
    records = load_data(str(tmp_path / "shards")).records
    assert [r.data["instruction"] for r in records[:5]] == ["a 0=", "a 1=", "c 0=", "x", "b 0="]
    with pytest.raises(DataError, match=r"c\.jsonl, line 2: missing field 'output'$"):
        ChatSFTDataset(str(tmp_path / "shards"), chatml_tokenizer, cache_dir=tmp_path)


def test_directory_without_data_files(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match=r"empty: no data files \(.json, .jsonl, .parquet\) in this directory"):
        load_data(str(tmp_path / "empty"))


def test_hub_id_that_does_not_resolve_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load_data("someorg/no-such-set:cfg@test")
    message = str(err.value)
    assert message.startswith(
        "someorg/no-such-set:cfg@test: no such file or directory, and the Hub dataset "
        "'someorg/no-such-set' (config cfg, split test) cannot be loaded:"
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    "location, call",
    [
        ("org/set", ("org/set", None, "train")),
        ("org/set:zh", ("org/set", "zh", "train")),
        ("org/set@validation", ("org/set", None, "validation")),
        ("set:en@train[:10%]", ("set", "en", "train[:10%]")),
    ],
)
def test_hub_ids_are_passed_to_load_dataset(monkeypatch, location, call):
    seen = []

    def fake_load_dataset(name, config, split):
        seen.append((name, config, split))
        return datasets.Dataset.from_list(alpaca(2, "h"))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    records = load_data(location).records
    assert seen == [call]
    assert records[1].where == f"{location}, row 1"


def test_missing_local_file_is_not_taken_for_a_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found"):
        load_data(str(tmp_path / "nope.jsonl"))


def test_parse_sources_from_flag_and_yaml_list():
    assert parse_sources("a.jsonl:0.7, b_dir:0.3") == [Source("a.jsonl", 0.7), Source("b_dir", 0.3)]
    assert parse_sources("org/set:zh") == [Source("org/set:zh")]
    assert parse_sources("org/set:zh:2,b.jsonl:1") == [Source("org/set:zh", 2.0), Source("b.jsonl", 1.0)]
    assert parse_sources([{"path": "a.jsonl", "weight": 3}, "b:1"]) == [Source("a.jsonl", 3.0), Source("b", 1.0)]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("a.jsonl:0,b.jsonl:1", r"^mixture source 'a.jsonl': weight '0' is not a positive number$"),
        ("a.jsonl:-1", r"^mixture source 'a.jsonl': weight '-1' is not a positive number$"),
        ("a.jsonl:x,b.jsonl:1", r"^mixture source 'a.jsonl': weight 'x' is not a positive number$"),
        ("a.jsonl:nan,b.jsonl:1", r"^mixture source 'a.jsonl': weight 'nan' is not a positive number$"),
        ("a.jsonl,b.jsonl:1", r"^mixture source 'a.jsonl': no weight; write it as a.jsonl:WEIGHT"),
        ([{"path": "a.jsonl", "weight": "lots"}, "b:1"], r"^mixture source 'a.jsonl': weight 'lots' is not a"),
    ],
)
def test_bad_mixture_weights(spec, message):
    with pytest.raises(DataError, match=message):
        parse_sources(spec)


def test_mixture_counts_follow_the_weights_and_repeat_with_the_seed(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", alpaca(10, "a"))
    datasets.Dataset.from_list(alpaca(6, "b")).save_to_disk(tmp_path / "b_dir")
    spec = f"{a}:0.7,{tmp_path / 'b_dir'}:0.3"
    first = load_data(spec, seed=1)
    # 16 samples: a gets 11.2 -> 11 (one repeat), b 4.8 -> 5 (largest remainder), so a.jsonl is read once whole.
    assert first.counts() == {a: 11, str(tmp_path / "b_dir"): 5}
    assert Counter(o[0] for o in outputs(first)) == {"a": 11, "b": 5}
    assert {f"a{i}" for i in range(10)} <= set(outputs(first))
    assert len(set(o for o in outputs(first) if o[0] == "b")) == 5  # drawn without replacement
    assert outputs(load_data(spec, seed=1)) == outputs(first)
    assert outputs(load_data(spec, seed=2)) != outputs(first)
    assert [o[0] for o in outputs(first)] != sorted(o[0] for o in outputs(first))  # interleaved, not concatenated
    assert first.summary() == f"data: 16 samples from 2 source(s) ({a}: 11, {tmp_path / 'b_dir'}: 5)"


def test_mixture_sources_reach_the_dataset(tmp_path, chatml_tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", alpaca(4, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", alpaca(4, "b"))
    ds = ChatSFTDataset(load_data(f"{a}:3,{b}:1", seed=0), chatml_tokenizer, cache_dir=tmp_path)
    assert ds.source_counts == {a: 6, b: 2}
    assert Counter(ds.sources) == {a: 6, b: 2}


def test_shares_add_up_exactly():
    assert sources._shares(10, [1, 1, 1]) == [4, 3, 3]
    assert sources._shares(7, [0.5, 0.25, 0.25]) == [3, 2, 2]


def test_same_records_from_two_files_keep_their_own_locations_in_one_cache(tmp_path, chatml_tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", alpaca(2, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", alpaca(2, "a"))
    ChatSFTDataset(a, chatml_tokenizer, cache_dir=tmp_path / "cache")
    from_b = ChatSFTDataset(b, chatml_tokenizer, cache_dir=tmp_path / "cache")
    assert from_b.sources == [b, b]


def test_arrow_rows_of_different_formats_read_nulls_as_absent(tmp_path, chatml_tokenizer):
    turns = [{"from": "human", "value": "1="}, {"from": "gpt", "value": "0 + 1"}]
    columns = {"instruction": ["1=", None], "output": ["0 + 1", None], "conversations": [None, turns]}
    datasets.Dataset.from_dict(columns).save_to_disk(tmp_path / "mixed")
    ds = ChatSFTDataset(str(tmp_path / "mixed"), chatml_tokenizer, cache_dir=tmp_path / "cache")
    assert len(ds) == 2 and ds[0] == ds[1]
