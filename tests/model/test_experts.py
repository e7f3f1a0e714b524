"""hf_lora_ds.model.experts: the MoE layout read from the module tree of each family, raw and PEFT-wrapped."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.nn.utils import parametrize
from transformers import AutoConfig, PretrainedConfig, PreTrainedTokenizerFast

from hf_lora_ds._testing.tiny_models import MOE_FAMILIES, build_tiny_moe
from hf_lora_ds.model.experts import MoeBlock, expert_weight_names, experts_per_token, moe_blocks, unwrapped_name
from hf_lora_ds.model.lora import wrap_with_lora

SHARED = {"qwen2_moe": "shared_expert", "deepseek_v3": "shared_experts"}
ROUTER = {"gpt_oss": "router"}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_each_family_layout_raw_and_wrapped(family: str, qwen_style_tokenizer: PreTrainedTokenizerFast) -> None:
    """The layout read from the raw model, from the PEFT-wrapped one, and from the wrapped one during its forward,
    where each ParamWrapper has moved its fused weight under ``parametrizations`` (read from a hook there, the
    stacks are found only through the parametrizations: outside a forward that branch never runs)."""
    model = build_tiny_moe(family, qwen_style_tokenizer)
    blocks = moe_blocks(model)
    layers = [1] if family == "deepseek_v3" else [0, 1]  # DeepSeek-V3's first layer is dense
    assert [block.layer for block in blocks] == layers
    block = blocks[-1]
    assert (block.path, block.num_experts, block.fused) == ("model.layers.1.mlp", 4, ("gate_up_proj", "down_proj"))
    assert block.shared == ((f"model.layers.1.mlp.{SHARED[family]}",) if family in SHARED else ())
    assert f"model.layers.1.mlp.{ROUTER.get(family, 'gate')}" in block.routers
    assert expert_weight_names(blocks) == ["down_proj", "gate_up_proj"]
    assert experts_per_token(model.config) == 2
    stacks = [param for block in blocks for param in block.fused_parameters()]
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["o_proj"], target_parameters=stacks))
    assert moe_blocks(wrapped) == blocks  # ParamWrappers nest the experts twice: the names are the model's own
    experts = wrapped.get_submodule("base_model.model.model.layers.1.mlp.experts.base_layer.base_layer")
    during_forward: list[tuple[bool, list[MoeBlock]]] = []
    hook = experts.register_forward_pre_hook(
        lambda module, args: during_forward.append((parametrize.is_parametrized(module), moe_blocks(wrapped)))
    )
    try:
        wrapped(input_ids=torch.tensor([[1, 2, 3, 4]]))
    finally:
        hook.remove()
    (parametrized, seen), *more = during_forward
    assert parametrized and not more  # the forward ran, with both stacks moved under parametrizations
    assert stacks_in_order(seen) == stacks_in_order(blocks)


def stacks_in_order(blocks: list[MoeBlock]) -> list[MoeBlock]:
    """``blocks`` with their fused stacks sorted: a parametrized stack is listed after the others, in the order the
    ParamWrappers ran (down_proj's outer one first)."""
    return [dataclasses.replace(block, fused=tuple(sorted(block.fused))) for block in blocks]


def test_a_dense_model_has_no_blocks_and_gates_are_routers(tiny_model, qwen_style_tokenizer):
    assert moe_blocks(tiny_model) == [] and experts_per_token(tiny_model.config) is None
    block = moe_blocks(build_tiny_moe("qwen2_moe", qwen_style_tokenizer))[0]
    assert block.routers == ("model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert_gate")
    name = "base_model.model.model.layers.1.mlp.experts.base_layer.base_layer"
    assert unwrapped_name(name) == "model.layers.1.mlp.experts"


@pytest.mark.parametrize("field", ["num_experts_per_tok", "moe_k", "moe_topk", "top_k"])
def test_the_top_k_is_read_from_each_family_s_field(field: str) -> None:
    """Remote-code configs (trust_remote_code: ERNIE's moe_k, Hunyuan's moe_topk) have no transformers alias to
    num_experts_per_tok: a field not read leaves such a model without its active-parameter count (MFU counts every
    expert) and its planner's dense-only copy to PEFT's target rewrite."""
    config = PretrainedConfig()
    setattr(config, field, 2)  # as a remote-code config's __init__ sets its own fields
    assert experts_per_token(config) == 2


def test_a_multimodal_config_s_top_k_is_its_text_config_s() -> None:
    """Qwen3-VL-MoE keeps num_experts_per_tok in its text config only."""
    config = AutoConfig.for_model("qwen3_vl_moe", text_config={"num_experts_per_tok": 3})
    assert getattr(config, "num_experts_per_tok", None) is None
    assert experts_per_token(config) == 3


def test_per_expert_linear_layout_raw_and_wrapped(qwen_style_tokenizer: PreTrainedTokenizerFast) -> None:
    """Remote-code experts (one MLP module per expert): the wrapped model's layout is the raw one, LoRA's own
    lora_A/lora_B Linear layers not taken for expert weights."""
    model = build_tiny_moe("mixtral", qwen_style_tokenizer)
    for layer in model.model.layers:
        layer.mlp.experts = torch.nn.ModuleList(
            torch.nn.ModuleDict({name: torch.nn.Linear(32, 16, bias=False) for name in ("w1", "w2")}) for _ in range(4)
        )
    blocks = moe_blocks(model)
    assert blocks[0].expert_linears == tuple(
        f"model.layers.0.mlp.experts.{e}.{w}" for e in range(4) for w in ("w1", "w2")
    )
    wrapped = wrap_with_lora(model, LoraConfig(r=2, target_modules=["w1", "w2"]))  # PEFT alone: no w1 without w3
    assert moe_blocks(wrapped) == blocks
