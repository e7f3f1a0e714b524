"""ZeRO-3's linear for LoRA: DeepSpeed's function keeping the input only for a weight that trains, with DeepSpeed's
results; and ``F.linear`` as it was after a block DeepSpeed replaced it in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from deepspeed.runtime.zero.linear import zero3_linear_wrap

from hf_lora_ds.training.zero3_linear import functional_linear_kept, lora_zero3_linear, zero3_linear_for_lora


def tensors(weight_trains: bool, with_bias: bool, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=generator, dtype=dtype, requires_grad=True)
    weight = torch.randn(3, 8, generator=generator, dtype=dtype, requires_grad=weight_trains)
    bias = torch.randn(3, generator=generator, dtype=dtype, requires_grad=weight_trains) if with_bias else None
    return x, weight, bias


def input_kept(linear, weight_trains: bool, with_bias: bool) -> bool:
    """Whether autograd keeps the input (or a view of it) of ``linear`` for backward."""
    x, weight, bias = tensors(weight_trains, with_bias)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: kept.append(tensor) or tensor, lambda tensor: tensor):
        linear(x, weight, bias)
    return any(tensor.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for tensor in kept)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("weight_trains", [False, True])
def test_the_input_is_kept_only_for_a_weight_that_trains(weight_trains, with_bias):
    """As torch's F.linear keeps it; DeepSpeed's keeps a frozen weight's input too."""
    assert input_kept(lora_zero3_linear, weight_trains, with_bias) is weight_trains
    assert input_kept(F.linear, weight_trains, with_bias) is weight_trains
    assert input_kept(zero3_linear_wrap, weight_trains, with_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("weight_trains", [False, True])
def test_outputs_and_gradients_are_deepspeed_s(weight_trains, with_bias, dtype):
    def run(linear):
        x, weight, bias = tensors(weight_trains, with_bias, dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.float32):
            output = linear(x, weight, bias)
        output.float().square().sum().backward()
        return [output, x.grad] + [t.grad for t in (weight, bias) if t is not None and t.requires_grad]

    ours, deepspeed = run(lora_zero3_linear), run(zero3_linear_wrap)
    assert len(ours) == len(deepspeed) == 2 + weight_trains * (1 + with_bias)
    for mine, theirs in zip(ours, deepspeed):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)


def test_the_step_s_linear_is_in_place_only_inside_and_only_for_zero3():
    original = torch.nn.functional.linear
    with zero3_linear_for_lora(False):
        assert torch.nn.functional.linear is original
    with zero3_linear_for_lora(True):
        assert torch.nn.functional.linear is lora_zero3_linear
    assert torch.nn.functional.linear is original


def test_f_linear_is_put_back_after_deepspeed_replaced_it(monkeypatch):
    original = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", original)  # undone even if the test fails

    @functional_linear_kept()
    def load_under_zero3() -> None:
        torch.nn.functional.linear = zero3_linear_wrap  # what deepspeed.zero.Init does, for the whole process

    load_under_zero3()
    assert torch.nn.functional.linear is original
    monkeypatch.setattr(torch.nn.functional, "linear", zero3_linear_wrap)  # a user's own zero.Init, before the run
    load_under_zero3()
    assert torch.nn.functional.linear is zero3_linear_wrap  # theirs, as they left it
