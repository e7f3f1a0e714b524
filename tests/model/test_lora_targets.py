"""hf_lora_ds.model.lora_targets: on each MoE family the demo's LoRA flags adapt every expert weight and every linear
layer but the router (DeepSeek-V3's dense first layer and shared experts included, which PEFT 0.21's own rewrite
drops: adapted through their weights, which it keeps), the dropout lands where PEFT takes it, and the experts'
flags choose what they say."""

from __future__ import annotations

import math
import re

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from hf_lora_ds._testing.tiny_models import MOE_FAMILIES, build_tiny_moe
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts import moe_blocks, unwrapped_name
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora
from hf_lora_ds.model.lora_coverage import lora_coverage
from hf_lora_ds.model.lora_targets import experts_line


def wrapped(family, tokenizer, **flags):
    return wrap_with_lora(
        build_tiny_moe(family, tokenizer), lora_config_from_args(SFTTrainingArguments.unbuilt(**flags))
    )


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


def test_rslora_keeps_the_experts_scaling_alpha_over_the_square_root_of_their_rank(
    qwen_style_tokenizer: PreTrainedTokenizerFast,
) -> None:
    """--use_rslora scales by alpha / sqrt(r): an expert rank apart from --lora_rank must keep the experts' scaling
    the other adapters', 16 / sqrt(8) here. An expert alpha scaled by r_e / r instead of its square root trains the
    experts at half the learning signal (2.83 instead of 5.66) and nothing else says so."""
    flags = {"lora_rank": 8, "lora_alpha": 16, "lora_expert_rank": 2, "use_rslora": True}
    found = adapters(wrapped("qwen2_moe", qwen_style_tokenizer, **flags))
    stack, shared = found["model.layers.0.mlp.experts.gate_up_proj"], found["model.layers.0.mlp.shared_expert.up_proj"]
    assert (stack.r["default"], shared.r["default"]) == (2, 8)
    assert stack.scaling["default"] == pytest.approx(shared.scaling["default"]) == pytest.approx(16 / math.sqrt(8))


def test_mixtral_s_transformers_4_names_adapt_both_fused_stacks(qwen_style_tokenizer: PreTrainedTokenizerFast) -> None:
    """Mixtral's targets as transformers 4 named its expert layers (w1, w3: gate_up_proj; w2: down_proj) adapt each
    fused stack they name: a target list written for a transformers-4 Mixtral adapter trains every expert weight."""
    found = adapters(wrapped("mixtral", qwen_style_tokenizer, lora_target_modules="q_proj,w1,w2,w3"))
    assert sorted(name for name in found if "layers.1" in name) == [
        "model.layers.1.mlp.experts.down_proj",
        "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.1.self_attn.q_proj",
    ]
    only_w2 = adapters(wrapped("mixtral", qwen_style_tokenizer, lora_target_modules="q_proj,w2"))
    assert [name for name in only_w2 if ".experts." in name] == [
        "model.layers.0.mlp.experts.down_proj",
        "model.layers.1.mlp.experts.down_proj",
    ]


@pytest.mark.parametrize("target", ["gate_proj", "up_proj"])
def test_either_half_of_a_fused_gate_up_proj_names_the_stack(
    target: str, qwen_style_tokenizer: PreTrainedTokenizerFast
) -> None:
    """gate_proj or up_proj alone adapts the fused gate_up_proj that holds it. On DeepSeek-V3 the name also matches
    the dense layer and the shared experts (adapted through their weights, which PEFT's transformers-4 rewrite of a
    plain reload leaves alone), so a lost mapping raises nothing: the routed experts would train without LoRA on
    their first projection."""
    found = adapters(wrapped("deepseek_v3", qwen_style_tokenizer, lora_target_modules=target))
    assert sorted(found) == [
        f"model.layers.0.mlp.{target}.weight",
        "model.layers.1.mlp.experts.gate_up_proj",
        f"model.layers.1.mlp.shared_experts.{target}.weight",
    ]


class NonGatedExperts(torch.nn.Module):
    """Fused experts without a gate (Nemotron-H's layout): up_proj (experts, intermediate, hidden) and down_proj."""

    def __init__(self, experts: int = 4, hidden: int = 32, intermediate: int = 16) -> None:
        super().__init__()
        self.up_proj = torch.nn.Parameter(torch.zeros(experts, intermediate, hidden))
        self.down_proj = torch.nn.Parameter(torch.zeros(experts, hidden, intermediate))


def test_mixtral_s_w3_names_a_fused_up_proj_without_a_gate(qwen_style_tokenizer: PreTrainedTokenizerFast) -> None:
    """w3, the up projection in transformers 4's names, adapts the fused up_proj of experts that have no gate."""
    model = build_tiny_moe("qwen3_moe", qwen_style_tokenizer)
    for layer in model.model.layers:
        layer.mlp.experts = NonGatedExperts()
    flags = SFTTrainingArguments.unbuilt(lora_target_modules="q_proj,w3")
    found = adapters(wrap_with_lora(model, lora_config_from_args(flags)))
    assert [name for name in found if ".experts." in name] == [
        "model.layers.0.mlp.experts.up_proj",
        "model.layers.1.mlp.experts.up_proj",
    ]


def test_the_experts_line_says_which_moe_layers_and_whether_the_router_are_adapted(
    qwen_style_tokenizer: PreTrainedTokenizerFast,
) -> None:
    """The line counts the MoE layers whose experts carry LoRA (an adapter built by hand may leave some out) and says
    when a router is adapted, as the coverage users check before a long run."""
    model = build_tiny_moe("qwen3_moe", qwen_style_tokenizer)
    config = LoraConfig(r=2, target_modules=["q_proj"], target_parameters=["model.layers.1.mlp.experts.down_proj"])
    assert experts_line(get_peft_model(model, config), 0.0).startswith(
        "experts: LoRA on down_proj (fused) of 4 experts in 1/2 MoE layers, rank 2 each; router not adapted;"
    )
    routed = wrapped("mixtral", qwen_style_tokenizer, lora_target_modules="q_proj,w1,w3,gate")
    assert "; router adapted (named);" in experts_line(routed, 0.0)


def test_a_moe_family_s_model_with_only_its_dense_layer_keeps_the_named_mlp_targets(
    qwen_style_tokenizer: PreTrainedTokenizerFast,
) -> None:
    """A MoE family's model without an MoE layer (the planner's one-layer copy of DeepSeek-V3, whose first layer is
    dense) is resolved all the same: left to PEFT, its transformers-4 rewrite drops the dense MLP's gate_proj,
    up_proj and down_proj, and the plan counts that layer without their adapters. They are adapted through their
    weights, which that rewrite leaves alone."""
    config = build_tiny_moe("deepseek_v3", qwen_style_tokenizer).config
    config.num_hidden_layers = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert moe_blocks(model) == []
    flags = SFTTrainingArguments.unbuilt(lora_target_modules="o_proj,gate_proj,up_proj,down_proj")
    assert sorted(adapters(wrap_with_lora(model, lora_config_from_args(flags)))) == [
        f"model.layers.0.{name}"
        for name in ("mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "self_attn.o_proj")
    ]


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
        wrap_with_lora(model, lora_config_from_args(SFTTrainingArguments.unbuilt(**flags)))


def test_per_expert_linear_experts_go_through_target_modules(qwen_style_tokenizer):
    """Remote-code MoE models (transformers 4's layout) keep one MLP module per expert: those Linear layers are the
    expert weights, adapted through target_modules with the experts' rank, and counted one by one."""
    model = build_tiny_moe("mixtral", qwen_style_tokenizer)
    for layer in model.model.layers:
        layer.mlp.experts = torch.nn.ModuleList(
            torch.nn.ModuleDict({name: torch.nn.Linear(32, 32, bias=False) for name in ("w1", "w2", "w3")})
            for _ in range(4)
        )
    model = wrap_with_lora(
        model, lora_config_from_args(SFTTrainingArguments.unbuilt(lora_target_experts="w1,w2", lora_expert_rank=2))
    )
    found = adapters(model)
    assert sorted(name for name in found if "layers.0.mlp" in name) == [
        f"model.layers.0.mlp.experts.{expert}.{weight}" for expert in range(4) for weight in ("w1", "w2")
    ]
    assert {found[name].r["default"] for name in found if ".experts." in name} == {2}
    assert lora_coverage(model).table().splitlines()[2] == "0-1      4/4        8/12"
    assert experts_line(model, 0.05).startswith("experts: LoRA on w1, w2 of 4 experts in 2/2 MoE layers, rank 2 each")
