"""hf_lora_ds.model.lora_targets: on each MoE family the demo's LoRA flags adapt every expert weight and every linear
layer but the router (DeepSeek-V3's dense first layer and shared experts included, which PEFT 0.21's own rewrite
drops: adapted through their weights, which it keeps), the dropout lands where PEFT takes it, and the experts'
flags choose what they say."""

from __future__ import annotations

import re

import pytest
import torch
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper

from hf_lora_ds._testing.tiny_models import MOE_FAMILIES, build_tiny_moe
from hf_lora_ds.config.lora import LoraArguments
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts import moe_blocks, unwrapped_name
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora
from hf_lora_ds.model.lora_coverage import lora_coverage
from hf_lora_ds.model.lora_targets import experts_line


def wrapped(family, tokenizer, **flags):
    return wrap_with_lora(build_tiny_moe(family, tokenizer), lora_config_from_args(LoraArguments(**flags)))


def adapters(model) -> dict[str, LoraLayer]:
    """Unwrapped name (with the adapted weight, for a fused one) -> LoRA layer."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            weight = f".{module.parameter_name}" if isinstance(module, ParamWrapper) else ""
            found[unwrapped_name(name) + weight] = module
    return found


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_the_demo_flags_adapt_every_expert_weight_and_linear_layer_but_the_router(family, qwen_style_tokenizer):
    model = wrapped(family, qwen_style_tokenizer)  # all-linear, lora_dropout 0.05: the demo's
    blocks = moe_blocks(model)
    found = adapters(model)
    stacks = {param for block in blocks for param in block.fused_parameters()}
    routers = tuple(router for block in blocks for router in block.routers)
    linears = {
        unwrapped_name(name)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ".lora_" not in name and "lm_head" not in name
    }
    # A Linear layer is adapted as a module, or through its weight where PEFT's rewrite would take it on a reload
    assert {name.removesuffix(".weight") for name in set(found) - stacks} == {
        name for name in linears if not name.startswith(routers)
    }
    by_weight = {name for name, layer in found.items() if isinstance(layer, ParamWrapper)} - stacks
    if family == "deepseek_v3":  # dropped by PEFT's transformers-4 rewrite (huggingface/peft#3711)
        assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"} <= by_weight
    else:
        assert not by_weight
    dropouts = {name: type(layer.lora_dropout["default"]).__name__ for name, layer in found.items()}
    assert {dropouts[name] for name in stacks | by_weight} == {"Identity"}  # PEFT's ParamWrapper takes none
    assert {dropouts[name] for name in set(found) - stacks - by_weight} == {"Dropout"}
    assert {layer.lora_dropout["default"].p for name, layer in found.items() if name not in stacks | by_weight} == {
        0.05
    }
    assert experts_line(model, 0.05).startswith(
        f"experts: LoRA on gate_up_proj, down_proj (fused) of 4 experts in {len(blocks)}/{len(blocks)} MoE layers, "
        "rank 8 each; router not adapted; lora_dropout 0.05 on the other adapters only"
    )


def test_the_experts_flag_and_the_expert_rank(qwen_style_tokenizer):
    none = adapters(wrapped("qwen3_moe", qwen_style_tokenizer, lora_target_experts="none"))
    assert not any(isinstance(layer, ParamWrapper) for layer in none.values()) and len(none) == 8
    named = adapters(wrapped("qwen3_moe", qwen_style_tokenizer, lora_target_experts="down_proj"))
    assert [name for name, layer in named.items() if isinstance(layer, ParamWrapper)] == [
        "model.layers.0.mlp.experts.down_proj",
        "model.layers.1.mlp.experts.down_proj",
    ]
    # Mixtral's transformers-4 names of the layers a fused gate_up_proj holds, and a router named on purpose.
    mixtral = adapters(wrapped("mixtral", qwen_style_tokenizer, lora_target_modules="q_proj,w1,w3,gate"))
    assert sorted(name for name in mixtral if "layers.1" in name) == [
        "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.self_attn.q_proj",
    ]
    ranked = adapters(wrapped("qwen2_moe", qwen_style_tokenizer, lora_rank=8, lora_alpha=16, lora_expert_rank=2))
    stack, shared = (
        ranked["model.layers.0.mlp.experts.gate_up_proj"],
        ranked["model.layers.0.mlp.shared_expert.up_proj"],
    )
    assert (stack.r["default"], stack.lora_A["default"].weight.shape[0], shared.r["default"]) == (2, 2 * 4, 8)
    assert stack.scaling["default"] == shared.scaling["default"] == 2.0  # alpha / r kept


@pytest.mark.parametrize(
    ("family", "flags", "message"),
    [
        (
            "qwen3_moe",
            {"lora_target_experts": "gate_proj_typo"},
            "--lora_target_experts gate_proj_typo: gate_proj_typo names no expert weight; the model's expert weights "
            "are down_proj, gate_up_proj (or use auto or none)",
        ),
        (
            "qwen3_moe",
            {"lora_target_modules": "q_proj,v_prj"},
            "--lora_target_modules q_proj,v_prj: v_prj matches no layer LoRA can adapt; the model's linear and "
            "embedding modules and expert weights are down_proj, embed_tokens, gate, gate_up_proj, k_proj, lm_head, "
            "o_proj, q_proj, v_proj (or use 'all-linear')",
        ),
        (None, {"lora_target_experts": "gate_up_proj"}, "--lora_target_experts gate_up_proj: the model has no experts"),
        ("gpt_oss", {"use_dora": True}, "--use_dora: PEFT has no DoRA for fused expert weights (lora.ParamWrapper)"),
        (
            "deepseek_v3",
            {"lora_init": "pissa"},
            "--lora_init pissa: PEFT starts fused expert weights (lora.ParamWrapper) only as default or gaussian; use "
            "one of those, or --lora_target_experts none to leave the experts (and routers) without LoRA",
        ),
    ],
)
def test_names_that_match_nothing_and_adapters_peft_cannot_build_are_one_line(
    family, flags, message, qwen_style_tokenizer, tiny_model
):
    model = build_tiny_moe(family, qwen_style_tokenizer) if family else tiny_model
    with pytest.raises(UserError, match=f"^{re.escape(message)}"):
        wrap_with_lora(model, lora_config_from_args(LoraArguments(**flags)))


def test_per_expert_linear_experts_go_through_target_modules(qwen_style_tokenizer):
    """Remote-code MoE models (transformers 4's layout) keep one MLP module per expert: those Linear layers are the
    expert weights, adapted through target_modules with the experts' rank, and counted one by one."""
    model = build_tiny_moe("mixtral", qwen_style_tokenizer)
    for layer in model.model.layers:
        layer.mlp.experts = torch.nn.ModuleList(
            torch.nn.ModuleDict({name: torch.nn.Linear(32, 32, bias=False) for name in ("w1", "w2", "w3")})
            for _ in range(4)
        )
    model = wrap_with_lora(model, lora_config_from_args(LoraArguments(lora_target_experts="w1,w2", lora_expert_rank=2)))
    found = adapters(model)
    assert sorted(name for name in found if "layers.0.mlp" in name) == [
        f"model.layers.0.mlp.experts.{expert}.{weight}" for expert in range(4) for weight in ("w1", "w2")
    ]
    assert {found[name].r["default"] for name in found if ".experts." in name} == {2}
    assert lora_coverage(model).table().splitlines()[2] == "0-1      4/4        8/12"
    assert experts_line(model, 0.05).startswith("experts: LoRA on w1, w2 of 4 experts in 2/2 MoE layers, rank 2 each")
