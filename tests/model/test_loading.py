"""What a run loads of its model: the tokenizer (refusing a base without weights before any data is tokenized, unless
nothing will load them), and the base's config without a weight read."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from hf_lora_ds.errors import UserError
from hf_lora_ds.model.loading import base_model_config, load_base_model, load_tokenizer
from hf_lora_ds.resources import MODEL_CONFIGS


def model_args(path, **changes) -> SimpleNamespace:
    values = dict(
        model_name_or_path=str(path),
        gguf_file=None,
        trust_remote_code=False,
        dtype="float32",
        torch_dtype=torch.float32,
        attn_implementation=None,
        experts_implementation="auto",
        device=torch.device("cpu"),
        load_in_4bit=False,
        load_in_8bit=False,
    )
    return SimpleNamespace(**{**values, **changes})


def test_tokenizer_and_base_of_a_model_directory(tiny_model_dir):
    args = model_args(tiny_model_dir)
    tokenizer = load_tokenizer(args)
    model, quantized = load_base_model(args)
    assert tokenizer.chat_template and quantized is None
    assert model.config.vocab_size >= len(tokenizer) and base_model_config(args).hidden_size == model.config.hidden_size


def test_a_directory_without_weights_is_refused_unless_none_are_needed(tiny_model_dir, tmp_path):
    copy = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(UserError, match=f"--model_name_or_path {copy}: "):
        load_tokenizer(model_args(copy))
    assert load_tokenizer(model_args(copy), need_weights=False).chat_template


def test_a_shipped_config_stands_for_its_hub_id_without_a_download():
    config = base_model_config(model_args("Qwen/Qwen2.5-7B-Instruct"))
    assert config.hidden_size == 3584
    assert (MODEL_CONFIGS / "qwen2.5-7b-instruct" / "config.json").is_file()


def test_a_moe_base_loads_with_the_experts_kernel_chosen_and_a_forced_one_that_cannot_run_is_refused_first(
    qwen_style_tokenizer, tmp_path, monkeypatch
):
    from hf_lora_ds._testing.tiny_models import build_tiny_moe

    build_tiny_moe("mixtral", qwen_style_tokenizer).save_pretrained(tmp_path)
    qwen_style_tokenizer.save_pretrained(tmp_path)
    model, _ = load_base_model(model_args(tmp_path, experts_implementation="batched_mm"))
    assert model.config._experts_implementation == "batched_mm"
    loads = []
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: loads.append(a))
    float64 = model_args(tmp_path, experts_implementation="grouped_mm", dtype="float64", torch_dtype=torch.float64)
    with pytest.raises(
        UserError, match="^--experts_implementation grouped_mm: torch's grouped GEMM does not run on cpu"
    ):
        load_base_model(float64)
    assert loads == []  # refused before the model is read


def test_a_vision_language_checkpoint_loads_with_its_tower(tmp_path):
    from hf_lora_ds._testing.tiny_vlms import save_tiny_vlm

    model, _ = load_base_model(model_args(save_tiny_vlm("qwen2_5_vl", tmp_path)))
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert model.get_encoder(modality="image") is model.model.visual
