"""hf_lora_ds.training.lora_init: EVA and CorDA read the run's own samples, batched by its own collator, the same ones
for the same seed; each data-driven start is what its method says (EVA: A from the inputs' principal directions,
B zero; CorDA: the model at its start is still the base). The ZeRO-3 gathering is exercised by tests/e2e."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.tuners.lora import LoraLayer

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.data.batches.collator import build_collator
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.model.lora import lora_config_from_args
from hf_lora_ds.training.lora_init import gathered_module_by_module, init_batches, wrap_as_initialised

RECORDS = [{"instruction": f"{x}=", "output": f"王大丫丫的回答是--->{x - 3} + 3"} for x in range(10, 42)]


@pytest.fixture
def run_data(qwen_style_tokenizer, tmp_path):
    return ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path), build_collator(
        "padded", qwen_style_tokenizer
    )


def _args(init: str, **changes) -> SFTTrainingArguments:
    values = dict(
        lora_init=init,
        lora_init_samples=16,
        per_device_train_batch_size=8,
        seed=0,
        lora_rank=4,
        lora_alpha=8,
        lora_dropout=0.0,
        lora_target_modules="all-linear",
        use_rslora=False,
        use_dora=False,
        model_name_or_path="tiny",
        train_vision_tower="off",
        train_projector="off",
    )
    return SFTTrainingArguments.unbuilt(**{**values, **changes})


def test_the_samples_follow_the_seed_and_come_batched_by_the_run_s_collator(run_data):
    dataset, collator = run_data
    batches = init_batches(dataset, collator, 10, 4, seed=0)
    assert [len(batch["input_ids"]) for batch in batches] == [4, 4, 2]
    assert set(batches[0]) == {"input_ids", "attention_mask", "labels"} and isinstance(batches[0], dict)
    again, other = init_batches(dataset, collator, 10, 4, seed=0), init_batches(dataset, collator, 10, 4, seed=1)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again))
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, other))


def test_a_data_driven_init_without_a_collator_says_so(run_data):
    with pytest.raises(ValueError, match="pass data_collator"):
        init_batches(run_data[0], None, 4, 2, seed=0)


def test_eva_starts_a_from_the_inputs_principal_directions_and_b_at_zero(tiny_model, run_data):
    args = _args("eva")
    model = wrap_as_initialised(tiny_model, lora_config_from_args(args), args, *run_data)
    layers = [module for module in model.modules() if isinstance(module, LoraLayer) and "default" in module.lora_A]
    assert layers
    for layer in layers:
        a = layer.lora_A["default"].weight
        assert not layer.lora_B["default"].weight.any()
        # SVD components: orthonormal rows (kaiming-uniform rows, PEFT's default A, are not)
        torch.testing.assert_close(a @ a.T, torch.eye(a.shape[0]), atol=1e-4, rtol=0)
    ranks = [layer.r["default"] for layer in layers]
    assert model.peft_config["default"].rank_pattern and len(set(ranks)) > 1  # redistributed by explained variance


def test_corda_starts_at_the_base(tiny_model, run_data):
    ids = torch.arange(3, 30).unsqueeze(0)
    with torch.no_grad():
        base = tiny_model.eval()(input_ids=ids).logits
        args = _args("corda")
        model = wrap_as_initialised(tiny_model, lora_config_from_args(args), args, *run_data).eval()
        start = model(input_ids=ids).logits
    assert model.peft_config["default"].init_lora_weights == "corda"
    assert any(
        layer.lora_B["default"].weight.abs().sum() > 0 for layer in model.modules() if isinstance(layer, LoraLayer)
    )
    torch.testing.assert_close(start, base, atol=1e-5 * base.abs().max().item(), rtol=0)


def test_without_zero3_the_forward_gathers_nothing(tiny_model):
    hooks = sum(len(module._forward_pre_hooks) for module in tiny_model.modules())
    with gathered_module_by_module(tiny_model):
        assert sum(len(module._forward_pre_hooks) for module in tiny_model.modules()) == hooks


def test_a_model_already_wrapped_is_kept(tiny_model, run_data):
    args = _args("eva")
    wrapped = wrap_as_initialised(tiny_model, LoraConfig(r=2, target_modules=["q_proj"]), _args("default"), *run_data)
    assert wrap_as_initialised(wrapped, lora_config_from_args(args), args, *run_data) is wrapped
