"""hf_lora_ds.model.experts_kernel: the experts' kernel chosen by running it on the device and dtype, a forced choice
that cannot run refused in one line, and LoRA-adapted experts running torch's grouped GEMM forward and backward."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_lora_ds._testing.tiny_models import build_tiny_moe
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts_kernel import (
    choose_experts_implementation,
    experts_kernel_text,
    grouped_mm_failure,
    use_experts_kernel,
)
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora

CPU = torch.device("cpu")


class AtenCalls(TorchDispatchMode):
    """How many times each aten op ran."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def test_auto_takes_grouped_mm_where_it_runs_and_a_forced_one_that_cannot_is_one_line():
    # torch's CPU grouped GEMM takes float32, bfloat16 and float16; float64 it refuses.
    assert choose_experts_implementation("auto", CPU, torch.float32) == "grouped_mm"
    assert choose_experts_implementation("auto", CPU, torch.float64) == "eager"
    assert choose_experts_implementation("batched_mm", CPU, torch.float64) == "batched_mm"
    with pytest.raises(
        UserError,
        match=r"^--experts_implementation grouped_mm: torch's grouped GEMM does not run on cpu in float64 \(.*\); "
        r"use auto \(eager here\), or batched_mm for a small model$",
    ):
        choose_experts_implementation("grouped_mm", CPU, torch.float64)


def test_lora_adapted_experts_run_the_grouped_kernel_forward_and_backward(qwen_style_tokenizer):
    calls = {}
    for kernel in ("grouped_mm", "eager"):
        model = build_tiny_moe("qwen3_moe", qwen_style_tokenizer)
        use_experts_kernel(model, kernel)
        model = wrap_with_lora(
            model, lora_config_from_args(SFTTrainingArguments.unbuilt())
        )  # the demo's LoRA: experts adapted
        ids = torch.randint(0, len(qwen_style_tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
        with AtenCalls() as ops:
            model(input_ids=ids, labels=ids).loss.backward()
        calls[kernel] = ops.calls
        expert_grads = [p.grad for n, p in model.named_parameters() if "experts" in n and "lora_B" in n]
        assert len(expert_grads) == 4 and all(grad.abs().sum() > 0 for grad in expert_grads)
        assert experts_kernel_text(model) == f"kernel {kernel}"
    # 2 layers x 2 stacks (W + BA each): the forward GEMM and both gradients', never a loop over the experts.
    assert calls["grouped_mm"]["aten._grouped_mm"] == 12
    assert calls["eager"]["aten._grouped_mm"] == 0 and calls["eager"]["aten.mm"] > calls["grouped_mm"]["aten.mm"]


def test_a_dense_model_keeps_its_kernel_and_a_fallback_says_why(tiny_model, qwen_style_tokenizer):
    use_experts_kernel(tiny_model, "grouped_mm")  # transformers would refuse grouped_mm on a dense model
    model = build_tiny_moe("mixtral", qwen_style_tokenizer).to(torch.float64)
    use_experts_kernel(model, choose_experts_implementation("auto", CPU, torch.float64))
    assert experts_kernel_text(model) == (
        "kernel eager (torch's grouped GEMM does not run on cpu in float64 (Expected mat_a to be Float32, BFloat16 "
        "or Float16 matrix, got Double))"
    )


def test_the_kernel_probe_draws_nothing_from_the_runs_random_stream():
    """It runs after the run's seed and before the adapter's init: a draw would change every run's trajectory (seen:
    ZeRO-3 runs that should match stopped matching from their second step)."""
    grouped_mm_failure.cache_clear()
    before = torch.get_rng_state()
    choose_experts_implementation("auto", torch.device("cpu"), torch.float32)
    assert torch.equal(torch.get_rng_state(), before)
