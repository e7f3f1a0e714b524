"""hf_lora_ds.model.source: a bad model path says which of directory, config, tokenizer or weights is missing."""

from __future__ import annotations

import shutil

import pytest

from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.source import check_model_source, hub_load_errors, looks_like_local_path


def model_copy_without(source, tmp_path, *patterns: str):
    """A copy of a saved model directory with the files matching ``patterns`` removed."""
    target = tmp_path / "model"
    shutil.copytree(source, target)
    for pattern in patterns:
        for path in target.glob(pattern):
            path.unlink()
    return target


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("Qwen/Qwen2.5-0.5B", False),
        ("gpt2", False),
        ("./models/qwen", True),
        ("/no/such/dir", True),
        ("~/model", True),
        ("a/b/c", True),
        ("org/name/", True),
    ],
)
def test_local_paths_are_told_from_hub_ids(name, local):
    assert looks_like_local_path(name) is local


def test_a_complete_model_directory_passes(tiny_model_dir):
    check_model_source(str(tiny_model_dir))


def test_no_such_directory(tmp_path):
    with pytest.raises(MissingPathError, match=r"--model_name_or_path .*/missing: no such directory"):
        check_model_source(str(tmp_path / "missing"))


def test_a_file_is_not_a_model_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError, match="is a file, not a model directory"):
        check_model_source(str(tmp_path / "weights.bin"))


@pytest.mark.parametrize(
    ("removed", "message"),
    [
        (("config.json",), "has no config.json"),
        (("tokenizer*", "vocab*", "merges.txt"), "has no tokenizer"),
        (("*.safetensors", "*.bin"), "has no weights"),
    ],
    ids=["config", "tokenizer", "weights"],
)
def test_each_missing_part_is_named(tiny_model_dir, tmp_path, removed, message):
    model = model_copy_without(tiny_model_dir, tmp_path, *removed)
    with pytest.raises(UserError, match=message):
        check_model_source(str(model), "--base")


def test_parts_not_needed_are_not_required(tiny_model_dir, tmp_path):
    model = model_copy_without(tiny_model_dir, tmp_path, "*.safetensors")
    check_model_source(str(model), "--tokenizer", need_weights=False)


def test_an_uncached_hub_id_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the local cache while HF_HUB_OFFLINE is set"):
        check_model_source("no-such-org/no-such-model")


def test_hub_load_failures_become_user_errors():
    with pytest.raises(UserError, match=r"--model org/name: .*fetching it from the Hugging Face Hub failed \(down\)"):
        with hub_load_errors("org/name", "--model"):
            raise OSError("down\nmore detail")
    with pytest.raises(OSError, match="truncated"), hub_load_errors("./local", "--model"):
        raise OSError("truncated")  # a local directory's OSError is not translated
