"""hf_lora_ds.training.lora_optimizers: LoRA+ keeps Trainer's optimizer and settings with B's groups at the ratio;
LoRA-FA trains B only, with A frozen at its init."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import TrainingArguments

from hf_lora_ds.model.lora_variants import DEFAULT_LORAPLUS_RATIO
from hf_lora_ds.training.lora_optimizers import create_lora_optimizer


def _args(tmp_path, optimizer: str, ratio: float | None = None) -> TrainingArguments:
    args = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-3, weight_decay=0.1, adam_beta2=0.95, report_to="none", use_cpu=True
    )
    args.lora_optimizer, args.loraplus_lr_ratio, args.lora_rank, args.lora_alpha = optimizer, ratio, 4, 8
    return args


@pytest.fixture
def model(tiny_model):
    return get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def _rates(model, optimizer) -> dict[str, set[float]]:
    names = {id(param): name for name, param in model.named_parameters()}
    rates: dict[str, set[float]] = {"lora_A": set(), "lora_B": set()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            rates["lora_A" if ".lora_A." in names[id(param)] else "lora_B"].add(group["lr"])
    return rates


@pytest.mark.parametrize(("ratio", "expected"), [(4.0, 4.0), (None, DEFAULT_LORAPLUS_RATIO)])
def test_loraplus_puts_b_at_the_ratio(model, tmp_path, ratio, expected):
    optimizer = create_lora_optimizer(model, _args(tmp_path, "loraplus", ratio))
    assert _rates(model, optimizer) == {"lora_A": {1e-3}, "lora_B": {1e-3 * expected}}
    assert isinstance(optimizer, torch.optim.AdamW)  # Trainer's own --optim, with its settings
    assert optimizer.defaults["fused"]  # transformers 5's default adamw_torch_fused, on the CPU too
    assert all(group["betas"] == (0.9, 0.95) for group in optimizer.param_groups)
    assert {group["weight_decay"] for group in optimizer.param_groups if group["params"]} == {0.1}


def test_lorafa_trains_b_only(model, tmp_path):
    a_before = {name: p.detach().clone() for name, p in model.named_parameters() if ".lora_A." in name}
    optimizer = create_lora_optimizer(model, _args(tmp_path, "lorafa"))
    assert not any(p.requires_grad for name, p in model.named_parameters() if ".lora_A." in name)
    model(input_ids=torch.arange(3, 20).unsqueeze(0), labels=torch.arange(3, 20).unsqueeze(0)).loss.backward()
    optimizer.step()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[name], tensor) for name, tensor in a_before.items())
    assert all(p.abs().sum() > 0 for name, p in after.items() if ".lora_B." in name)


def test_lorafa_scales_b_by_the_adapter_s_alpha_over_r(model, tmp_path):
    """LoRA-FA divides B's projected gradient by the square of the LoRA scaling, alpha / r (8 / 4 here): PEFT 0.21
    reads it per module (``scaling_factors``); the one ``scaling_factor`` of the group, built from the ``r`` and
    ``lora_alpha`` passed in, is what earlier PEFT versions apply to every module."""
    group = create_lora_optimizer(model, _args(tmp_path, "lorafa")).param_groups[0]
    assert group.get("scaling_factor", 2.0) == 2.0
    factors = {factor for name, factor in zip(group["names"], group["scaling_factors"]) if ".lora_B." in name}
    assert factors == {2.0}
