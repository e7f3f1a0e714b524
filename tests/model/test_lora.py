"""hf_lora_ds.model.lora: the flags become PEFT's LoraConfig as written, a typo among the targets is named before PEFT
trains the others silently, and a model that already has an adapter keeps it."""

from __future__ import annotations

import pytest
from peft import LoraConfig, PeftModel

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.lora import (
    check_target_modules,
    lora_config_from_args,
    parse_targets,
    shape_config,
    targets_text,
    trainable_parameters_line,
    wrap_with_lora,
)


def _args(**overrides):
    values = dict(
        lora_rank=4,
        lora_alpha=8,
        lora_dropout=0.1,
        lora_target_modules="all-linear",
        use_rslora=False,
        use_dora=False,
        lora_init="default",
    )
    return SFTTrainingArguments.unbuilt(**{**values, **overrides})


@pytest.mark.parametrize(
    ("text", "targets"),
    [
        ("all-linear", "all-linear"),
        (" all-linear ", "all-linear"),
        ("q_proj,v_proj", ["q_proj", "v_proj"]),
        (" q_proj , ,v_proj,", ["q_proj", "v_proj"]),
    ],
)
def test_targets_as_peft_takes_them(text, targets):
    assert parse_targets(text) == targets


def test_the_config_carries_every_flag():
    config = lora_config_from_args(_args(lora_target_modules="q_proj,v_proj", use_rslora=True))
    settings = (config.r, config.lora_alpha, config.lora_dropout, config.use_rslora, config.use_dora)
    assert settings == (4, 8, 0.1, True, False)
    assert config.task_type == "CAUSAL_LM"
    assert targets_text(config) == "q_proj,v_proj"
    assert targets_text(lora_config_from_args(_args())) == "all-linear"


def test_a_typo_among_the_targets_is_named_with_the_modules_there_are(tiny_model):
    with pytest.raises(UserError) as raised:
        check_target_modules(tiny_model, LoraConfig(target_modules=["q_proj", "v_prj"]))
    message = str(raised.value)
    assert message.startswith("--lora_target_modules q_proj,v_prj: v_prj matches no layer LoRA can adapt")
    assert "v_proj" in message.split("modules are")[1]


def test_full_and_suffix_names_both_match(tiny_model):
    check_target_modules(tiny_model, LoraConfig(target_modules=["self_attn.q_proj", "model.layers.0.mlp.up_proj"]))


def test_wrapping_adds_an_adapter_once_and_counts_what_trains(tiny_model):
    wrapped = wrap_with_lora(tiny_model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert isinstance(wrapped, PeftModel)
    assert wrap_with_lora(wrapped, LoraConfig(r=8, target_modules=["v_proj"])) is wrapped  # a resumed adapter is kept
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in wrapped.parameters())
    assert trainable_parameters_line(wrapped).startswith(f"trainable params: {trainable:,} || all params: {total:,}")


@pytest.mark.parametrize(
    ("init", "peft_init"),
    [
        ("default", True),
        ("gaussian", "gaussian"),
        ("pissa_niter_4", "pissa_niter_4"),
        ("olora", "olora"),
        ("orthogonal", "orthogonal"),
        ("loftq", True),
    ],
)
def test_the_init_flag_becomes_peft_s_init_lora_weights(init, peft_init):
    assert lora_config_from_args(_args(lora_init=init)).init_lora_weights == peft_init


def test_eva_and_corda_carry_their_configs_and_shapes_drop_them():
    eva, corda = (lora_config_from_args(_args(lora_init=init)) for init in ("eva", "corda"))
    assert eva.eva_config is not None and eva.corda_config is None
    assert corda.corda_config.corda_method == "ipm"
    for config in (eva, corda):
        shapes = shape_config(config)
        assert (shapes.init_lora_weights, shapes.eva_config, shapes.corda_config) == (True, None, None)
        assert (shapes.r, shapes.target_modules) == (config.r, config.target_modules)
