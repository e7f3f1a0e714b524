"""LoRA updates added by one ``addmm`` in a training step (hf_lora_ds.training.lora_update): PEFT's outputs and
gradients, two fewer passes over a layer's output in forward and one in backward; only for the listed layers and
only within the block."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from torch.utils._python_dispatch import TorchDispatchMode

from hf_lora_ds.training.lora_update import one_matmul_layers, updates_in_one_matmul
from tests.trainer.test_lora_sft_trainer import make_trainer
from tests.training.test_adapter_inputs import lora_stack

OUTPUT = (8, 32)  # the stack's `up` layer's output: the widest adapted output


class OutputPasses(TorchDispatchMode):
    """The ops that write a tensor of the `up` layer's whole output (views write nothing)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += isinstance(out, torch.Tensor) and tuple(out.shape) == OUTPUT and not func.is_view
        return out


def step(model: torch.nn.Module, x: torch.Tensor, one_matmul: bool, autocast: bool = False):
    """Output, input and adapter gradients, and the passes over `up`'s output in forward and in backward."""
    torch.manual_seed(1)  # the same dropout draw
    x.grad = None
    with updates_in_one_matmul(one_matmul_layers(model, partitioned=False) if one_matmul else []):
        with OutputPasses() as forward, torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            output = model(x)
        with OutputPasses() as backward:
            output.float().square().sum().backward()
    grads = [x.grad.clone(), *(p.grad.clone() for p in model.parameters() if p.requires_grad)]
    model.zero_grad()
    return output, grads, (forward.count, backward.count)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_peft_s_outputs_and_gradients_with_fewer_passes_over_the_output(dropout):
    model = lora_stack(dtype=torch.float32, lora_dropout=dropout)
    x = torch.randn(8, 16, requires_grad=True)
    peft_output, peft_grads, peft_passes = step(model, x, one_matmul=False)
    output, grads, passes = step(model, x, one_matmul=True)
    torch.testing.assert_close(output, peft_output)
    assert len(grads) == 5
    for grad, peft_grad in zip(grads, peft_grads):
        torch.testing.assert_close(grad, peft_grad)
    # forward: base, lora_B's matmul, the scale, the sum -> base, addmm; backward: the scaled gradient goes
    assert (passes[0], passes[1]) == (peft_passes[0] - 2, peft_passes[1] - 1)


ON_CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_under_autocast_the_update_is_one_16_bit_addmm_no_further_from_fp32(device):
    model = lora_stack(dtype=torch.bfloat16, device=device)
    x = torch.randn(8, 16, dtype=torch.bfloat16, device=device, requires_grad=True)
    exact, exact_grads, _ = step(copy.deepcopy(model).float(), x.detach().float().requires_grad_(), one_matmul=False)
    peft_output, peft_grads, peft_passes = step(model, x, one_matmul=False, autocast=True)
    output, grads, passes = step(model, x, one_matmul=True, autocast=True)
    assert output.dtype == torch.bfloat16 and passes[0] == peft_passes[0] - 2

    def error(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a.float() - b).abs().mean().item()

    assert error(output, exact) <= error(peft_output, exact)  # one rounding of the sum instead of three
    for grad, peft_grad, exact_grad in zip(grads, peft_grads, exact_grads):
        assert error(grad, exact_grad) <= 1.5 * error(peft_grad, exact_grad)


def test_a_16_bit_result_with_fp32_adapters_outside_autocast_keeps_peft_s_sum():
    """PEFT promotes the sum to fp32 and rounds it back once: the same bits."""
    model = lora_stack(dtype=torch.bfloat16)
    x = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    peft_output, peft_grads, _ = step(model, x, one_matmul=False)
    output, grads, _ = step(model, x, one_matmul=True)
    assert torch.equal(output, peft_output)
    assert all(torch.equal(a, b) for a, b in zip(grads, peft_grads))


@pytest.mark.filterwarnings("ignore:`lora_bias=True` was passed")  # the stack's layers have no bias to merge into
def test_only_layers_whose_lora_b_call_is_its_matmul():
    model = lora_stack()
    assert len(one_matmul_layers(model, partitioned=False)) == 2
    assert one_matmul_layers(model, partitioned=True) == []  # ZeRO-3 gathers lora_B's weight in its call
    assert one_matmul_layers(lora_stack(use_dora=True), partitioned=False) == []
    assert one_matmul_layers(lora_stack(lora_bias=True), partitioned=False) == []


def test_a_layer_whose_lora_b_has_a_hook_when_the_step_begins_keeps_peft_s_form():
    """A hook on the call the update would bypass runs (accelerate's device map, a user's), added at any time."""
    model = lora_stack()
    layers = one_matmul_layers(model, partitioned=False)
    calls = []
    model.base_model.model.up.lora_B["default"].register_forward_pre_hook(lambda module, args: calls.append(1))
    with updates_in_one_matmul(layers):
        model(torch.randn(2, 16, dtype=torch.bfloat16))
        assert [bool(layer.lora_variant) for layer in layers] == [False, True]
    assert calls == [1]
    add_hook_to_module(model.base_model.model.down.lora_B["default"], ModelHook())
    with updates_in_one_matmul(layers):
        assert not any(layer.lora_variant for layer in layers)


def test_peft_s_form_is_back_after_the_block_even_when_it_fails():
    model = lora_stack()
    layers = one_matmul_layers(model, partitioned=False)
    with pytest.raises(RuntimeError, match="stop"), updates_in_one_matmul(layers):
        assert all(layer.lora_variant for layer in layers)
        raise RuntimeError("stop")
    assert not any(layer.lora_variant for layer in layers)


def test_a_training_step_adds_by_one_matmul_and_generation_does_not(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=2)
    assert trainer.one_matmul_layers
    layer = trainer.one_matmul_layers[0]
    forms = []
    layer.register_forward_pre_hook(
        lambda module, args: forms.append((torch.is_grad_enabled(), bool(module.lora_variant)))
    )
    trainer.train()
    assert forms == [(True, True)] * 2
    trainer.model.eval()
    with torch.no_grad():
        trainer.model(input_ids=torch.tensor([[1, 2, 3]], device=trainer.args.device))
    assert forms[2:] == [(False, False)]
