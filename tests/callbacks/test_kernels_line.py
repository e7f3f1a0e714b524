"""The ``kernels:`` line is read from what trains (hf_lora_ds.callbacks.kernels_line): a CPU run's defaults, and each
flag that changes a kernel changes its words."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from hf_lora_ds.callbacks.kernels_line import kernels_line, kernels_record, optimizer_kind
from hf_lora_ds.training.loss_head import FULL_LOGITS, LIGER_HEAD
from tests.trainer.test_lora_sft_trainer import make_trainer

CPU_DEFAULT = (
    "kernels: attention sdpa, padded; LoRA update addmm; loss fused chunked LM head; optimizer AdamW fused; "
    "torch.compile off"
)


def test_a_cpu_run_prints_and_records_its_kernels(tiny_model, qwen_style_tokenizer, tmp_path, package_log):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    trainer.train()
    assert package_log.read().count(CPU_DEFAULT) == 1
    trainer.save_state()
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert [entry["kernels"] for entry in state["log_history"] if "kernels" in entry] == [
        CPU_DEFAULT.removeprefix("kernels: ")
    ]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"optim": "adamw_torch"}, "optimizer AdamW for-loop"),  # foreach on CUDA tensors only
        ({"supervised_logits_only": False}, f"loss {FULL_LOGITS}"),
        ({"lora_optimizer": "lorafa"}, "optimizer LoraFAOptimizer"),
        ({"lora_optimizer": "loraplus"}, "optimizer AdamW fused"),
        ({"use_dora": True}, "LoRA update PEFT's"),  # DoRA's own forward
    ],
)
def test_flags_change_the_words(tiny_model, qwen_style_tokenizer, tmp_path, flags, words):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1, **flags)
    trainer.create_optimizer()
    assert words in kernels_line(kernels_record(trainer))


def test_attention_liger_and_compile_are_named(tiny_model, qwen_style_tokenizer, tmp_path):
    """Liger cannot run here (CUDA only): its words, with the flag set after the trainer's checks."""
    tiny_model.set_attn_implementation("eager")
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    trainer.create_optimizer()
    trainer.args.use_liger_kernel = True
    trainer.args.liger_kernel_config = {"swiglu": False}
    trainer.model.base_model.model.model.layers[0].compile()
    line = kernels_line(kernels_record(trainer))
    assert line.startswith("kernels: attention eager, padded; LoRA update addmm;")
    assert f"loss {LIGER_HEAD}; Liger rope, rms_norm, fused_linear_cross_entropy;" in line
    assert line.endswith("torch.compile regional (1 layers)")


def test_deepspeed_s_own_optimizer_is_named_under_its_wrappers():
    deepspeed_adam = type("FusedAdam", (torch.optim.Adam,), {"__module__": "deepspeed.ops.adam.fused_adam"})
    inner = deepspeed_adam([torch.nn.Parameter(torch.zeros(1))])
    wrapped = SimpleNamespace(optimizer=SimpleNamespace(optimizer=inner))  # accelerate's wrapper of ZeRO's
    assert optimizer_kind(wrapped) == "FusedAdam (DeepSpeed)"
