"""python -m hf_lora_ds.merge writes a standalone safetensors model that computes what base + adapter computed."""

from __future__ import annotations

import shutil

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_lora_ds.cli.merge import main
from hf_lora_ds.errors import run_cli

PROMPTS = ["What is the capital of France?", "Tell me a joke about cats."]


def _logits(model, tokenizer, prompt: str) -> torch.Tensor:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_cli_writes_a_model_matching_base_plus_adapter(tiny_model_dir, trained_adapter, tmp_path, capsys):
    out = tmp_path / "merged"
    assert (
        main(["--model_name_or_path", str(tiny_model_dir), "--adapter", str(trained_adapter), "--out", str(out)]) == 0
    )
    assert "max abs logit diff" in capsys.readouterr().out
    assert list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
    assert not (out / "adapter_config.json").exists()  # a plain HF model, loadable without peft

    tokenizer = AutoTokenizer.from_pretrained(out)
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    base_logits = [_logits(base, tokenizer, prompt) for prompt in PROMPTS]
    with_adapter = PeftModel.from_pretrained(base, str(trained_adapter)).eval()
    for prompt, plain in zip(PROMPTS, base_logits):
        expected = _logits(with_adapter, tokenizer, prompt)
        torch.testing.assert_close(_logits(merged, tokenizer, prompt), expected, atol=1e-4, rtol=1e-4)
        assert (expected - plain).abs().max() > 1e-2, "the adapter must change the output, else this proves nothing"


def test_empty_adapter_fails_with_the_cause(tiny_model_dir, trained_adapter, tmp_path, capsys):
    broken = tmp_path / "empty-adapter"
    shutil.copytree(trained_adapter, broken)
    weights = {name: torch.empty(0) for name in load_file(broken / "adapter_model.safetensors")}
    save_file(weights, broken / "adapter_model.safetensors")
    with pytest.raises(SystemExit) as exited:
        run_cli(
            lambda: main(
                ["--model_name_or_path", str(tiny_model_dir), "--adapter", str(broken), "--out", str(tmp_path / "out")]
            )
        )
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "empty" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_cli_also_writes_a_gguf_that_loads_back_as_the_merged_model(tiny_model_dir, trained_adapter, tmp_path):
    pytest.importorskip("gguf", reason="GGUF export needs the gguf package: pip install 'hf_lora_ds[gguf]'")
    out, gguf_file = tmp_path / "merged", tmp_path / "gguf" / "merged.gguf"
    argv = ["--model_name_or_path", str(tiny_model_dir), "--adapter", str(trained_adapter), "--out", str(out)]
    assert main([*argv, "--gguf", str(gguf_file), "--gguf_type", "f32"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    exported = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    for prompt in PROMPTS:
        torch.testing.assert_close(_logits(exported.eval(), tokenizer, prompt), _logits(merged, tokenizer, prompt))


def test_paths_are_checked_before_anything_is_loaded(tmp_path, trained_adapter, capsys):
    """Adapter, output directory and GGUF file: one line each, exit 2, before the (here missing) base is read."""
    afile, empty = tmp_path / "afile", tmp_path / "empty"
    afile.write_text("")
    empty.mkdir()
    base = ["--model_name_or_path", str(tmp_path / "no-base")]
    cases = {
        (f"--adapter {afile}: is a file, not an adapter directory"): ["--adapter", str(afile), "--out", str(empty)],
        (f"--adapter {empty}: the directory has no adapter_config.json"): [
            "--adapter",
            str(empty),
            "--out",
            str(empty),
        ],
        (f"--out {afile}: {afile} is a file, not a directory"): [
            "--adapter",
            str(trained_adapter),
            "--out",
            str(afile),
        ],
        (f"--gguf {empty}: is a directory; pass the GGUF file to write"): [
            "--adapter",
            str(trained_adapter),
            "--out",
            str(tmp_path / "out"),
            "--gguf",
            str(empty),
        ],
        (f"--gguf {afile}/m.gguf: {afile} is a file, not a directory"): [
            "--adapter",
            str(trained_adapter),
            "--out",
            str(tmp_path / "out"),
            "--gguf",
            str(afile / "m.gguf"),
        ],
    }
    for message, argv in cases.items():
        with pytest.raises(SystemExit) as leaving:
            run_cli(lambda argv=argv: main([*base, *argv]))
        assert leaving.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_the_old_base_flag_still_works_with_a_note(tiny_model_dir, trained_adapter, tmp_path, capsys):
    assert main(["--base", str(tiny_model_dir), "--adapter", str(trained_adapter), "--out", str(tmp_path / "o")]) == 0
    assert "--base is deprecated; use --model_name_or_path" in capsys.readouterr().err


def test_gguf_of_a_moe_model_is_refused_before_the_merge(qwen_style_tokenizer, trained_adapter, tmp_path, capsys):
    """GGUF export writes Llama and Qwen2: for a Mixture-of-Experts base the refusal comes before a merge that, for a
    30B model, takes its time (and leaves no half-written export)."""
    from hf_lora_ds._testing.tiny_models import build_tiny_moe

    base = tmp_path / "moe"
    build_tiny_moe("qwen3_moe", qwen_style_tokenizer).save_pretrained(base)
    capsys.readouterr()  # the save's progress bar
    argv = ["--model_name_or_path", str(base), "--adapter", str(trained_adapter), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as leaving:
        run_cli(lambda: main([*argv, "--gguf", str(tmp_path / "m.gguf")]))
    assert leaving.value.code == 2 and not (tmp_path / "out").exists()
    assert capsys.readouterr().err == (
        f"error: --gguf: {base} is a qwen3_moe model (a Mixture-of-Experts model: its experts are not exported); "
        "GGUF export supports llama and qwen2 only (the merged Hugging Face model is still written with --out)\n"
    )
