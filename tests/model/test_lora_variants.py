"""hf_lora_ds.model.lora_variants: every combination that cannot work is refused from the flags, in one line that
says what to change, before anything loads; the line under the coverage table says what the variant does."""

from __future__ import annotations

import re

import pytest
from peft import LoraConfig

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.lora_variants import (
    check_lora_optimizer_engine,
    check_lora_variant,
    variant_line,
)


def _args(**changes) -> SFTTrainingArguments:
    values = dict(
        lora_init="default",
        lora_init_samples=256,
        lora_optimizer="adamw",
        loraplus_lr_ratio=None,
        lora_rank=8,
        load_in_4bit=False,
        load_in_8bit=False,
        use_dora=False,
        fsdp=None,
        gguf_file=None,
        model_name_or_path="org/model",
    )
    return SFTTrainingArguments.unbuilt(**{**values, **changes})


@pytest.mark.parametrize(
    "init", ["default", "gaussian", "pissa", "pissa_niter_4", "olora", "eva", "corda", "orthogonal"]
)
def test_full_precision_variants_pass(init):
    check_lora_variant(_args(lora_init=init))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lora_init": "svd"}, "--lora_init svd: unknown; use one of default, gaussian, pissa"),
        ({"lora_init": "pissa_niter_x"}, "--lora_init pissa_niter_x: N in pissa_niter_N is the number of subspace"),
        ({"lora_init": "pissa_niter_"}, "--lora_init pissa_niter_: N in pissa_niter_N is the number of subspace"),
        ({"lora_init": "pissa_niter_N"}, "a whole number such as pissa_niter_4"),
        (
            {"lora_init": "loftq"},
            "--lora_init loftq fits the adapter to the 4-bit quantisation error of the base: add --load_in_4bit",
        ),
        ({"lora_init": "loftq", "load_in_4bit": True, "gguf_file": "m.gguf"}, "reads the full-precision weights"),
        (
            {"lora_init": "pissa", "load_in_4bit": True},
            "--lora_init pissa with --load_in_4bit: pissa rewrites the base",
        ),
        ({"lora_init": "olora", "load_in_8bit": True}, "--lora_init olora with --load_in_8bit: olora rewrites"),
        ({"lora_init": "corda", "load_in_4bit": True}, "use --lora_init loftq with --load_in_4bit"),
        ({"lora_init": "orthogonal", "lora_rank": 5}, "--lora_init orthogonal needs an even --lora_rank, got 5"),
        ({"lora_init": "pissa_niter_2", "use_dora": True}, "with --use_dora: the adapter is converted"),
        ({"lora_init": "olora", "fsdp": "full_shard"}, "--lora_init olora with --fsdp"),
        ({"lora_init_samples": 0}, "--lora_init_samples must be a positive integer, got 0"),
        ({"lora_optimizer": "sgd"}, "--lora_optimizer sgd: unknown"),
        ({"loraplus_lr_ratio": 8.0}, "--loraplus_lr_ratio 8.0 has no effect with --lora_optimizer adamw"),
        (
            {"lora_optimizer": "loraplus", "loraplus_lr_ratio": 0.5},
            "--loraplus_lr_ratio must be a finite number of at least 1",
        ),
        (
            {"lora_optimizer": "loraplus", "loraplus_lr_ratio": float("nan")},
            "at least 1 (B learns faster than A), got nan",
        ),
        (
            {"lora_optimizer": "loraplus", "loraplus_lr_ratio": float("inf")},
            "at least 1 (B learns faster than A), got inf",
        ),
        ({"lora_optimizer": "lorafa", "use_dora": True}, "--lora_optimizer lorafa with --use_dora"),
    ],
)
def test_impossible_combinations_are_one_line_that_says_what_to_change(changes, message):
    with pytest.raises(UserError) as raised:
        check_lora_variant(_args(**changes))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_loftq_on_a_4bit_base_needs_its_safetensors(tmp_path):
    with pytest.raises(UserError, match=f"{tmp_path} has none"):
        check_lora_variant(_args(lora_init="loftq", load_in_4bit=True, model_name_or_path=str(tmp_path)))
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_lora_variant(_args(lora_init="loftq", load_in_4bit=True, model_name_or_path=str(tmp_path)))


@pytest.mark.parametrize(
    ("optimizer", "stage", "section", "fsdp", "message"),
    [
        ("loraplus", 2, True, None, 'its "optimizer" section makes DeepSpeed build its own optimizer'),
        ("lorafa", 1, False, None, "--lora_optimizer lorafa with ZeRO stage 1 (ds.json)"),
        ("lorafa", None, False, "full_shard", "--lora_optimizer lorafa with FSDP"),
    ],
)
def test_the_engine_must_take_the_lora_optimizer_whole(optimizer, stage, section, fsdp, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_lora_optimizer_engine(_args(lora_optimizer=optimizer, fsdp=fsdp), stage, section, "ds.json")


@pytest.mark.parametrize(("optimizer", "stage"), [("loraplus", 3), ("lorafa", 0), ("lorafa", None), ("adamw", 3)])
def test_engines_that_take_the_lora_optimizer(optimizer, stage):
    check_lora_optimizer_engine(_args(lora_optimizer=optimizer), stage, False, "ds.json")


def test_the_variant_line():
    assert variant_line(LoraConfig(r=8)) is None
    assert variant_line(LoraConfig(r=8, init_lora_weights="pissa", lora_dropout=0.0)) == (
        "LoRA init pissa; adapter converted at the end to plain LoRA of rank 16 for the original base"
    )
    assert "--lora_dropout 0.05 also drops the principal part" in variant_line(
        LoraConfig(r=8, init_lora_weights="olora", lora_dropout=0.05)
    )
    eva = LoraConfig(r=8, init_lora_weights="eva", rank_pattern={"a": 4, "b": 12})
    assert variant_line(eva, _args(lora_init="eva", lora_init_samples=64)) == (
        "LoRA init eva; a pass over 64 training samples before step 1; "
        "ranks after the data pass 4-12 (budget r 8 a module)"
    )
    assert variant_line(LoraConfig(r=8), _args(lora_optimizer="loraplus")) == (
        "LoRA init default; LoRA+: B at 16x the learning rate of A"
    )
    assert variant_line(LoraConfig(r=8), _args(lora_optimizer="lorafa", lora_init="loftq")) == (
        "LoRA init loftq; LoRA-FA: A frozen, only B trains"
    )
    assert variant_line(LoraConfig(r=8, use_dora=True)).endswith("DoRA: + a magnitude vector per adapted module")
