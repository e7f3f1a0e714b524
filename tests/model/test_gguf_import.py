"""GGUF bases in: a .gguf file loads as the model to fine-tune, merge into or evaluate, and a file transformers
cannot build a model from is one line naming the flag."""

from __future__ import annotations

import importlib.util
import json

import pytest

from hf_lora_ds._testing.tiny_models import build_tiny_causal_lm
from hf_lora_ds.cli.eval import main as eval_main
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.gguf_export import export_gguf
from hf_lora_ds.model.gguf_import import model_source

gguf = pytest.importorskip("gguf", reason="GGUF support needs the gguf package: pip install 'hf_lora_ds[gguf]'")


def test_eval_cli_reads_a_gguf_model(qwen_style_tokenizer, tmp_path, capsys):
    build_tiny_causal_lm("llama", qwen_style_tokenizer).save_pretrained(tmp_path / "hf")
    qwen_style_tokenizer.save_pretrained(tmp_path / "hf")
    model = export_gguf(tmp_path / "hf", tmp_path / "gguf" / "model.gguf", "f16")
    data = tmp_path / "eval.json"
    data.write_text(json.dumps([{"instruction": "7=", "input": "", "output": "5 + 2"}]))
    argv = [
        "--model_name_or_path",
        str(model.parent),
        "--gguf_file",
        model.name,
        "--data",
        str(data),
        "--max_new_tokens",
        "4",
    ]
    assert eval_main([*argv, "--output_dir", str(tmp_path / "report")]) == 0
    assert json.loads((tmp_path / "report" / "eval_report.json").read_text())["eval"]["num_samples"] == 1
    assert "accuracy" in capsys.readouterr().out


def _unsupported_architecture(path):
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_bad_gguf_files_are_one_line_naming_the_flag(tmp_path, monkeypatch):
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file" * 100)
    with pytest.raises(UserError, match=r"--model_name_or_path: .*junk.gguf: not a readable GGUF file"):
        model_source(str(tmp_path / "junk.gguf"))
    _unsupported_architecture(tmp_path / "rwkv.gguf")
    with pytest.raises(UserError, match="--gguf_file rwkv.gguf: .*transformers cannot load this GGUF model"):
        model_source(str(tmp_path), "rwkv.gguf")
    with pytest.raises(MissingPathError, match="no such GGUF file"):
        model_source(str(tmp_path / "absent.gguf"))

    real_find_spec = importlib.util.find_spec
    hide_gguf = lambda name, *rest: None if name == "gguf" else real_find_spec(name, *rest)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hide_gguf)
    with pytest.raises(UserError, match=r"needs the gguf package.*hf_lora_ds\[gguf\]"):
        model_source(str(tmp_path / "junk.gguf"))


def test_truncated_gguf_is_refused(tiny_dir, tmp_path):
    whole = export_gguf(tiny_dir, tmp_path / "whole.gguf", "f16").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="not a readable GGUF file"):
        model_source(str(tmp_path / "cut.gguf"))
