"""LoRA inputs left in the compute dtype under autocast on an accelerator (hf_lora_ds.training.adapter_inputs): the
same outputs and gradients to the bit as PEFT's cast to the fp32 adapters, fewer ops; only in a training step that
autocasts on an accelerator."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.utils._python_dispatch import TorchDispatchMode

from hf_lora_ds.trainer import lora_sft_trainer
from hf_lora_ds.training.adapter_inputs import inputs_as_they_come, uncast_in_training, uncast_lora_layers
from tests.trainer.test_lora_sft_trainer import make_trainer


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def lora_stack(dtype: torch.dtype = torch.bfloat16, device: str = "cpu", **options) -> torch.nn.Module:
    torch.manual_seed(0)
    model = get_peft_model(Stack().to(dtype), LoraConfig(r=4, target_modules=["up", "down"], **options)).to(device)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: no gradient would reach A or the input through it
            torch.nn.init.normal_(param)
    return model


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def step(model: torch.nn.Module, x: torch.Tensor, uncast: bool) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Output, input and adapter gradients, and the ops of one autocast forward and backward."""
    torch.manual_seed(1)  # the same dropout draw
    x.grad = None
    with OpCount() as count, inputs_as_they_come(uncast_lora_layers(model) if uncast else []):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            output = model(x)
        output.float().square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    return output, [x.grad.clone(), *grads], count.ops


def assert_same_bits_with_fewer_ops(model: torch.nn.Module, x: torch.Tensor) -> None:
    cast_output, cast_grads, cast_ops = step(model, x, uncast=False)
    output, grads, ops = step(model, x, uncast=True)
    assert torch.equal(output, cast_output)
    assert len(grads) == 5 and all(torch.equal(a, b) for a, b in zip(grads, cast_grads))
    assert ops <= cast_ops - 2 * 2 * 2  # two layers: two casts each in forward, two in backward


def test_the_same_bits_with_fewer_ops():
    """Without dropout on the CPU (whose dropout scales a bf16 input in bf16: not the path this is for)."""
    x = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    assert_same_bits_with_fewer_ops(lora_stack(lora_dropout=0.0), x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_same_bits_with_fewer_ops_on_cuda_with_dropout():
    """CUDA's fused dropout draws the same mask for a bf16 input as for its fp32 copy and scales in fp32."""
    x = torch.randn(64, 16, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    assert_same_bits_with_fewer_ops(lora_stack(lora_dropout=0.1, device="cuda"), x)


def test_the_cast_is_back_after_the_block_even_when_it_fails():
    model = lora_stack()
    layers = uncast_lora_layers(model)
    with pytest.raises(RuntimeError, match="stop"), inputs_as_they_come(layers):
        assert not any(layer.cast_input_dtype_enabled for layer in layers)
        raise RuntimeError("stop")
    assert all(layer.cast_input_dtype_enabled for layer in layers)
    model(torch.randn(2, 16, dtype=torch.bfloat16))  # no autocast: PEFT's cast makes the dtypes meet


def test_only_plain_layers_with_adapters_in_another_dtype_on_an_autocasting_accelerator():
    model = lora_stack()
    assert len(uncast_lora_layers(model)) == 2
    assert uncast_lora_layers(lora_stack(dtype=torch.float32)) == []  # the adapters' dtype already
    assert uncast_lora_layers(lora_stack(use_dora=True)) == []  # DoRA computes on the cast input
    assert len(uncast_in_training(model, autocasts=True, on_accelerator=True)) == 2
    assert uncast_in_training(model, autocasts=True, on_accelerator=False) == []
    assert uncast_in_training(model, autocasts=False, on_accelerator=True) == []  # DeepSpeed, fp32


def casts_seen_in_training(trainer) -> list[bool]:
    layer = next(m for m in trainer.model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer"))
    seen = []
    layer.register_forward_pre_hook(lambda module, args: seen.append(getattr(module, "cast_input_dtype_enabled", True)))
    trainer.train()
    assert seen and getattr(layer, "cast_input_dtype_enabled", True)  # PEFT's cast back after the step
    return seen


def test_a_training_step_takes_the_inputs_uncast_where_the_run_lists_layers(
    tiny_model, qwen_style_tokenizer, tmp_path, monkeypatch
):
    """As on an accelerator (the list is made as there): the step's forward and backward run uncast. A bf16 run on
    the CPU keeps PEFT's cast."""

    def bf16_trainer(path):
        return make_trainer(tiny_model, qwen_style_tokenizer, path, max_steps=1, bf16=True, use_cpu=True)

    tiny_model.to(torch.bfloat16)
    cpu = bf16_trainer(tmp_path / "cpu")
    assert cpu.accelerator.native_amp and cpu._uncast_lora_layers == []
    assert all(casts_seen_in_training(cpu))
    monkeypatch.setattr(
        lora_sft_trainer, "uncast_in_training", lambda model, autocasts, on_accelerator: uncast_lora_layers(model)
    )
    accelerator = bf16_trainer(tmp_path / "accelerator")
    assert accelerator._uncast_lora_layers
    assert not any(casts_seen_in_training(accelerator))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_bf16_training_step_on_cuda_takes_the_inputs_uncast(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_model.to("cuda", torch.bfloat16), qwen_style_tokenizer, tmp_path, max_steps=1, bf16=True
    )
    assert trainer._uncast_lora_layers
    assert not any(casts_seen_in_training(trainer))
