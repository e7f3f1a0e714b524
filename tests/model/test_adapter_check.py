"""verify_adapter accepts a good adapter and names the defect in broken ones (empty, wrong shape, wrong base)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
from hf_lora_ds.model.adapter_check import AdapterIntegrityError, verify_adapter

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def good_adapter(tmp_path_factory, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", rank_pattern={"down_proj": 2}),
    )
    path = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(path)
    return path


def _broken_copy(good_adapter, tmp_path, mutate) -> str:
    """A copy of the good adapter whose first lora_A tensor is replaced by ``mutate(tensor)``."""
    path = tmp_path / "broken"
    shutil.copytree(good_adapter, path)
    weights = load_file(path / WEIGHTS)
    name = sorted(key for key in weights if ".lora_A." in key and "q_proj" in key)[0]
    weights[name] = mutate(weights[name])
    save_file(weights, path / WEIGHTS)
    return str(path)


@pytest.mark.parametrize("with_base", [False, True])
def test_good_adapter_passes(good_adapter, tiny_model_dir, with_base):
    verify_adapter(good_adapter, base_model=tiny_model_dir if with_base else None)


@pytest.mark.parametrize("with_base", [False, True])
def test_zero_size_tensor_is_rejected(good_adapter, tiny_model_dir, tmp_path, with_base):
    broken = _broken_copy(good_adapter, tmp_path, lambda tensor: torch.empty(0))
    with pytest.raises(AdapterIntegrityError, match="empty.*stage3_gather_16bit_weights_on_model_save"):
        verify_adapter(broken, base_model=tiny_model_dir if with_base else None)


def test_wrong_in_features_is_rejected_against_base(good_adapter, tiny_model_dir, tmp_path):
    broken = _broken_copy(good_adapter, tmp_path, lambda tensor: torch.zeros(tensor.shape[0], tensor.shape[1] + 3))
    verify_adapter(broken)  # rank is still right: only the base knows in_features
    with pytest.raises(AdapterIntegrityError, match=r"q_proj\.lora_A\.weight: saved \(4, 35\).*implies \(4, 32\)"):
        verify_adapter(broken, base_model=tiny_model_dir)


def test_rank_disagreeing_with_config_is_rejected_without_base(good_adapter, tmp_path):
    broken = _broken_copy(good_adapter, tmp_path, lambda tensor: torch.zeros(8, tensor.shape[1]))
    with pytest.raises(AdapterIntegrityError, match=r"ranks \{'lora_A': 8, 'lora_B': 4\}"):
        verify_adapter(broken)


def test_non_finite_values_are_rejected(good_adapter, tmp_path):
    broken = _broken_copy(good_adapter, tmp_path, lambda tensor: torch.full_like(tensor, float("nan")))
    with pytest.raises(AdapterIntegrityError, match="NaN"):
        verify_adapter(broken)


def test_missing_config_is_rejected(good_adapter, tmp_path):
    path = tmp_path / "no-config"
    shutil.copytree(good_adapter, path)
    (path / "adapter_config.json").unlink()
    with pytest.raises(AdapterIntegrityError, match="adapter_config.json is missing"):
        verify_adapter(path)


def test_adapter_for_another_base_is_rejected(good_adapter, tmp_path, qwen_style_tokenizer):
    wider = tmp_path / "wider-base"
    build_tiny_qwen2(qwen_style_tokenizer, hidden_size=64).save_pretrained(wider)
    with pytest.raises(AdapterIntegrityError, match="does not fit base"):
        verify_adapter(good_adapter, base_model=wider)


def test_target_modules_absent_from_base_are_rejected(good_adapter, tiny_model_dir, tmp_path):
    path = tmp_path / "other-targets"
    shutil.copytree(good_adapter, path)
    config = json.loads((path / "adapter_config.json").read_text())
    config["target_modules"] = ["no_such_proj"]
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterIntegrityError, match="does not apply to base"):
        verify_adapter(path, base_model=tiny_model_dir)


def test_checking_inside_a_zero3_run_builds_no_partitioned_model(good_adapter, tiny_model_dir, monkeypatch):
    """Rank 0 verifies alone while a ZeRO-3 config is live: entering zero.Init there would hang the other ranks.
    (Asserted on zero.Init itself: whether torch.distributed is up depends on the tests run before in this process.)"""
    import deepspeed
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    def refuse(*args, **kwargs):
        raise AssertionError("verify_adapter entered deepspeed.zero.Init")

    monkeypatch.setattr(deepspeed.zero, "Init", refuse)
    live = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    try:
        assert is_deepspeed_zero3_enabled()
        verify_adapter(good_adapter, base_model=tiny_model_dir)
    finally:
        del live
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()


def test_a_moe_adapter_stacks_one_rank_per_expert(qwen_style_tokenizer, tmp_path):
    """A fused expert stack's lora_A is (r x experts, in): the check accepts that stacking (without the base it knows
    no expert count, so any multiple of an allowed rank) and still refuses a stack whose A and B disagree."""
    from hf_lora_ds._testing.tiny_models import build_tiny_moe
    from hf_lora_ds.config import SFTTrainingArguments
    from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora

    base = build_tiny_moe("deepseek_v3", qwen_style_tokenizer)
    wrap_with_lora(base, lora_config_from_args(SFTTrainingArguments.unbuilt(lora_expert_rank=4))).save_pretrained(
        tmp_path / "moe"
    )
    verify_adapter(tmp_path / "moe")
    verify_adapter(tmp_path / "moe", base_model=base.config)
    weights = load_file(tmp_path / "moe" / WEIGHTS)
    stack = "base_model.model.model.layers.1.mlp.experts.lora_A.weight"
    assert weights[stack].shape[0] == 4 * 4  # rank 4 (--lora_expert_rank), 4 experts
    weights[stack] = torch.zeros(12, weights[stack].shape[1])
    save_file(weights, tmp_path / "moe" / WEIGHTS)
    with pytest.raises(AdapterIntegrityError, match=r"experts has ranks \{'lora_A': 12, 'lora_B': 16\}"):
        verify_adapter(tmp_path / "moe")
