"""GGUF in and out: bases read through transformers' GGUF loader (bad files refused in one line), and merged Llama /
Qwen2 models written as GGUF files that load back with the same logits (within the format's precision), the same
prompt ids and the same chat template."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import run_sft
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.eval.__main__ import main as eval_main
from hf_lora_ds.gguf_export import export_gguf
from hf_lora_ds.gguf_source import model_source, plain_model
from hf_lora_ds.merge import main as merge_main
from hf_lora_ds.tiny import build_tiny_qwen2

gguf = pytest.importorskip("gguf", reason="GGUF support needs the gguf package: pip install 'hf_lora_ds[gguf]'")

MESSAGES = [{"role": "user", "content": "What is the capital of France? 12 + 30"}]
# Max |logit difference| allowed, as a fraction of the largest |logit|: F32 is exact (a wrong q/k layout is not),
# the others round every weight (Q8_0: 8-bit values with one scale per 32).
TOLERANCE = {"f32": 1e-5, "f16": 1e-2, "bf16": 5e-2, "q8_0": 1e-1}


def _tiny(arch: str, tokenizer):
    """Hidden 64 (whole Q8_0 blocks); Qwen2 ties its output to the embedding and has q/k/v biases, Llama does not."""
    model = build_tiny_qwen2(tokenizer, hidden_size=64, num_hidden_layers=2)
    if arch == "llama":
        config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**{**config, "tie_word_embeddings": False}))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fresh init's logits are near zero: large weights make a wrong layout show
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_dir(request, tmp_path_factory, qwen_style_tokenizer):
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    _tiny(request.param, qwen_style_tokenizer).save_pretrained(path)
    qwen_style_tokenizer.save_pretrained(path)
    return path


def _load(path, **kwargs):
    source, source_kwargs = model_source(str(path), **kwargs)
    model = plain_model(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **source_kwargs)).eval()
    return model, AutoTokenizer.from_pretrained(source, **source_kwargs)


@pytest.mark.parametrize("outtype", list(TOLERANCE))
def test_exported_gguf_loads_back_with_the_same_logits_ids_and_template(tiny_dir, outtype, tmp_path):
    out = export_gguf(tiny_dir, tmp_path / f"model-{outtype}.gguf", outtype)  # alone in its directory: no HF files
    reference, tokenizer = _load(tiny_dir)
    loaded, loaded_tokenizer = _load(out)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    loaded_ids = loaded_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                                      return_dict=True)
    assert torch.equal(loaded_ids["input_ids"], ids["input_ids"])
    with torch.no_grad():
        expected, got = reference(**ids).logits, loaded(**ids).logits
    assert (got - expected).abs().max() <= TOLERANCE[outtype] * expected.abs().max(), outtype


def test_gguf_base_to_tuned_gguf_with_run_sft_and_merge(qwen_style_tokenizer, tmp_path):
    model_dir = tmp_path / "hf"
    _tiny("qwen2", qwen_style_tokenizer).save_pretrained(model_dir)
    qwen_style_tokenizer.save_pretrained(model_dir)
    base = export_gguf(model_dir, tmp_path / "base.gguf", "q8_0")
    records = [{"instruction": f"{x}=", "input": "", "output": f"{x - 2} + 2"} for x in range(10, 26)]
    (tmp_path / "train.json").write_text(json.dumps(records))
    flags = ["--train_file", str(tmp_path / "train.json"), "--eval_file", "", "--output_dir", str(tmp_path / "out"),
             "--max_steps", "2", "--per_device_train_batch_size", "4", "--dataset_cache_dir", str(tmp_path / "c")]
    run_sft.main(["--model_name_or_path", str(tmp_path), "--gguf_file", base.name, *flags])
    # The README's second command: merge onto the GGUF base, write the tuned model as GGUF too.
    merged = tmp_path / "tuned" / "model.gguf"
    assert merge_main(["--base", str(base), "--adapter", str(tmp_path / "out"), "--out", str(tmp_path / "merged"),
                       "--gguf", str(merged), "--gguf_type", "f32"]) == 0
    (expected, tokenizer), (got, _) = _load(tmp_path / "merged"), _load(merged)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        torch.testing.assert_close(got(**ids).logits, expected(**ids).logits)
    with pytest.raises(MissingPathError, match="--gguf_file other.gguf"):
        run_sft.main(["--model_name_or_path", str(tmp_path), "--gguf_file", "other.gguf", *flags])


def test_eval_cli_reads_a_gguf_model(qwen_style_tokenizer, tmp_path, capsys):
    _tiny("llama", qwen_style_tokenizer).save_pretrained(tmp_path / "hf")
    qwen_style_tokenizer.save_pretrained(tmp_path / "hf")
    model = export_gguf(tmp_path / "hf", tmp_path / "gguf" / "model.gguf", "f16")
    data = tmp_path / "eval.json"
    data.write_text(json.dumps([{"instruction": "7=", "input": "", "output": "5 + 2"}]))
    argv = ["--model", str(model.parent), "--gguf_file", model.name, "--data", str(data), "--max_new_tokens", "4"]
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
