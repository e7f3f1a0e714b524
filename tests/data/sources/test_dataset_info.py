"""LLaMA-Factory's dataset_info.json with --dataset: entries read with their own columns and tags, or refused."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.sources import load_data
from tests.data.peer_records import END, chatml, expect, sample

# Records as LLaMA-Factory's data README writes each formatting, under its own column names.
ALPACA = {"q": "Tell me a joke", "extra": "", "a": "cats.", "sys": "Be brief.", "hist": [["Hello", "Bonjour!"]]}
SHAREGPT = {
    "messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Bonjour!"}],
    "system_prompt": "Be brief.",
}
INFO = {
    "my_alpaca": {
        "file_name": "alpaca.json",
        "columns": {"prompt": "q", "query": "extra", "response": "a", "system": "sys", "history": "hist"},
    },
    "my_chat": {
        "file_name": "chat.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "system": "system_prompt"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    },
    "demo_dpo": {"file_name": "dpo.json", "ranking": True, "columns": {"prompt": "instruction", "chosen": "chosen"}},
    "hub": {"hf_hub_url": "someone/data"},
    "vision": {
        "file_name": "mllm.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
    },
    "video": {
        "file_name": "mllm_video.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "videos": "videos"},
    },
}


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "dataset_info.json").write_text(json.dumps(INFO, indent=2))
    (folder / "alpaca.json").write_text(json.dumps([ALPACA], indent=2))
    (folder / "chat.jsonl").write_text(json.dumps(SHAREGPT) + "\n")
    return folder


def test_entries_are_read_with_their_columns_and_tags(data_dir, chatml_tokenizer, tmp_path):
    alpaca_text = chatml(
        ("system", "Be brief."),
        ("user", "Hello"),
        ("assistant", "Bonjour!"),
        ("user", "Tell me a joke"),
        ("assistant", "cats."),
    )
    chat_text = chatml(("system", "Be brief."), ("user", "Hello"), ("assistant", "Bonjour!"))
    for location in (data_dir / "dataset_info.json", data_dir):  # the file or its folder
        loaded = load_data(str(location), cache_dir=tmp_path, dataset="my_alpaca, my_chat")
        assert loaded.counts() == {"my_alpaca": 1, "my_chat": 1}
        dataset = ChatSFTDataset(loaded, chatml_tokenizer, cache_dir=tmp_path)
        by_source = dict(zip(dataset.sources, (sample(dataset, i) for i in range(len(dataset)))))
        assert by_source["my_alpaca"] == expect(chatml_tokenizer, alpaca_text, ["Bonjour!" + END, "cats." + END])
        assert by_source["my_chat"] == expect(chatml_tokenizer, chat_text, ["Bonjour!" + END])
        assert dataset.unused_note() == ""


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (
            None,
            r"dataset_info.json: LLaMA-Factory's dataset_info.json, not a data file; name the entries to train on "
            r"with --dataset NAME\[,NAME\] \(entries: demo_dpo, hub, my_alpaca, my_chat, video, vision\)",
        ),
        ("nope", r"dataset_info.json: no entry 'nope' \(--dataset\); entries: demo_dpo"),
        ("demo_dpo", r"entry 'demo_dpo': a ranking \(preference\) dataset, not SFT data"),
        ("hub", r"entry 'hub': hf_hub_url 'someone/data': no hub is reached from here"),
        ("video", r"entry 'video': columns.videos: multimodal \(videos\) data"),
    ],
)
def test_entries_that_cannot_be_served_are_refused_in_one_line_naming_the_entry(data_dir, tmp_path, names, message):
    with pytest.raises(DataError, match=message) as err:
        load_data(str(data_dir), cache_dir=tmp_path, dataset=names)
    assert "\n" not in str(err.value)


def test_dataset_without_a_dataset_info_is_refused(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"instruction": "1=", "output": "0 + 1"}) + "\n")
    with pytest.raises(DataError, match=r"--dataset a: names entries of LLaMA-Factory's dataset_info.json"):
        load_data(str(path), cache_dir=tmp_path, dataset="a")


def test_an_images_entry_finds_its_images_in_the_info_folder_as_llamafactory_does(data_dir, tmp_path):
    """LLaMA-Factory's media_dir defaults to the dataset_info.json folder, even for a file in a subfolder."""
    from PIL import Image

    from hf_lora_ds.data.formats import to_conversation

    (data_dir / "sub").mkdir()
    Image.new("RGB", (2, 2)).save(data_dir / "cat.png")
    record = {
        "messages": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "A cat."}],
        "images": ["cat.png"],
    }
    (data_dir / "sub" / "mllm.json").write_text(json.dumps([record]))
    info = {"vision": {**INFO["vision"], "file_name": "sub/mllm.json"}}
    (data_dir / "dataset_info.json").write_text(json.dumps(info))
    loaded = load_data(str(data_dir), cache_dir=tmp_path, dataset="vision")
    (row,) = loaded.records
    conversation = to_conversation(row.data, row.where, options=loaded.formats["vision"], images=True)
    assert conversation["images"] == [str(data_dir / "cat.png")]
    assert conversation["messages"][0]["content"] == "<image>?"
