"""hf_lora_ds.training.liger: --use_liger_kernel refused in one line where it cannot work, and what Liger's patching
rebinds outside the model (transformers' modeling modules and classes, torch.nn) bound as before once the run ends.
Liger itself needs CUDA: its patching stands in as a fake that rebinds what Liger 0.8's ``apply_liger_kernel_to_*``
functions do (tests/training/test_supervised_logits.py trains with the real one on a GPU)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch
from transformers import trainer as trainer_module
from transformers.models.qwen2 import modeling_qwen2

from hf_lora_ds.errors import UserError
from hf_lora_ds.training.liger import check_liger, liger_ops, liger_patches_restored
from tests.trainer.test_lora_sft_trainer import make_trainer


def fake_liger_patch(model, kernel_config=None) -> None:
    """What Liger's instance patching rebinds beyond the model: module functions and classes, a class's forward (it
    inherited none before), torch's cross-entropy and LayerNorm."""
    modeling_qwen2.apply_rotary_pos_emb = lambda *args, **kwargs: None
    modeling_qwen2.Qwen2RMSNorm = type("LigerRMSNorm", (torch.nn.Module,), {})
    modeling_qwen2.Qwen2PreTrainedModel.forward = lambda self, *args, **kwargs: None
    torch.nn.functional.cross_entropy = lambda *args, **kwargs: None
    torch.nn.LayerNorm = type("LigerLayerNorm", (torch.nn.Module,), {})


def bindings() -> dict[str, object]:
    return {
        "apply_rotary_pos_emb": modeling_qwen2.apply_rotary_pos_emb,
        "Qwen2RMSNorm": modeling_qwen2.Qwen2RMSNorm,
        "forward defined": "forward" in vars(modeling_qwen2.Qwen2PreTrainedModel),
        "cross_entropy": torch.nn.functional.cross_entropy,
        "LayerNorm": torch.nn.LayerNorm,
    }


def test_what_liger_rebinds_is_bound_as_before_after_the_block():
    before = bindings()
    try:
        with liger_patches_restored():
            fake_liger_patch(None)
            assert bindings() != before
        assert bindings() == before
    finally:  # a failing restore must not leak into the other tests
        for name, value in before.items():
            if name in ("apply_rotary_pos_emb", "Qwen2RMSNorm"):
                setattr(modeling_qwen2, name, value)
        vars(modeling_qwen2.Qwen2PreTrainedModel).get("forward") and delattr(
            modeling_qwen2.Qwen2PreTrainedModel, "forward"
        )
        torch.nn.functional.cross_entropy, torch.nn.LayerNorm = before["cross_entropy"], before["LayerNorm"]


def test_a_run_restores_them(tiny_model, qwen_style_tokenizer, tmp_path, monkeypatch):
    """Trainer applies Liger inside ``train()``; the flag is set after the trainer's checks, which refuse it here."""
    before = bindings()
    applied = []
    monkeypatch.setattr(
        trainer_module, "apply_liger_kernel", lambda *args: (applied.append(1), fake_liger_patch(*args))
    )
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    trainer.args.use_liger_kernel = True
    try:
        trainer.train()
    except Exception:  # noqa: BLE001  (the fake breaks the model; the run's end is what is tested)
        pass
    assert applied and bindings() == before


def liger_args(**overrides) -> SimpleNamespace:
    return SimpleNamespace(**{"use_liger_kernel": True, "use_cpu": False, "liger_kernel_config": None, **overrides})


def test_refused_when_not_installed(tiny_model, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(UserError, match=r"--use_liger_kernel: liger-kernel is not installed; pip install"):
        check_liger(liger_args(), tiny_model)


@pytest.fixture
def installed_liger(monkeypatch):
    """liger_kernel as far as the check reads it: its table of patched families (qwen2 among them)."""
    monkey_patch = ModuleType("liger_kernel.transformers.monkey_patch")
    monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": None, "qwen2": None}
    for name, module in {
        "liger_kernel": ModuleType("liger_kernel"),
        "liger_kernel.transformers": ModuleType("liger_kernel.transformers"),
        "liger_kernel.transformers.monkey_patch": monkey_patch,
    }.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)


def test_refused_without_cuda(tiny_model, installed_liger, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="--use_liger_kernel needs a CUDA device"):
        check_liger(liger_args(), tiny_model)


def test_refused_for_a_family_liger_does_not_patch(tiny_model, installed_liger, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_liger(liger_args(), tiny_model)  # qwen2
    tiny_model.config.model_type = "gpt2"
    with pytest.raises(UserError, match="Liger has no kernels for gpt2 models; it patches llama, qwen2"):
        check_liger(liger_args(), tiny_model)


def test_the_ops_named_follow_the_config():
    assert liger_ops(liger_args()) == ["rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"]
    config = {"fused_linear_cross_entropy": False, "cross_entropy": True}
    assert liger_ops(liger_args(liger_kernel_config=config)) == ["rope", "rms_norm", "swiglu", "cross_entropy"]
    assert liger_ops(liger_args(use_liger_kernel=False)) == []
