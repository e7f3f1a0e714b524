"""The wiring from a run's flags into the plan: every flag that changes the plan changes it as the planner says.

The estimate's terms are tested elsewhere against PlanSettings built by hand; here the same plan is made twice,
once through run_sft's path (``plan_this_run`` on parsed flags) and once from PlanSettings written out for what the
flag means, and the chosen row must be the same, and differ from the plan without the flag. A flag dropped or
mistranslated on its way in (``--load_in_4bit`` planned as an unquantized base: frozen weights at bf16 size) was
green in every other plan test. A simulated GPU (as in test_run_plan.py) so dtype and memory are a GPU's.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import replace

import psutil
import pytest
import torch
from peft import LoraConfig, TaskType

from hf_lora_ds.cli.plan import parse
from hf_lora_ds.model.source import load_model_config
from hf_lora_ds.plan.planner import CUDA_CONTEXT_BYTES, PlanSettings, SequenceProfile, make_plan
from hf_lora_ds.plan.run_plan import plan_this_run
from hf_lora_ds.resources import MODEL_CONFIGS

MODEL = str(MODEL_CONFIGS / "qwen2.5-0.5b-instruct")
PROFILE = SequenceProfile.from_samples(
    [512] + [64] * 63, [32] * 64
)  # one long sample: padding-free batches are shorter


@pytest.fixture(autouse=True)
def one_16gb_gpu(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: namedtuple("memory", "total")(512 * 2**30))
    for name, value in {"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "RANK": "0"}.items():
        monkeypatch.setenv(name, value)


def plan_from_flags(*flags: str):
    args, _ = parse(
        [
            "--model_name_or_path",
            MODEL,
            "--device_memory",
            "16GiB",
            "--max_length",
            "512",
            "--per_device_train_batch_size",
            "2",
            *flags,
        ]
    )
    return plan_this_run(args, PROFILE)[0]


BASE = PlanSettings(
    model_config=load_model_config(MODEL, False),
    lora=LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear"),
    dtype=torch.bfloat16,
    batch_size=2,
    profile=PROFILE,
    world_size=1,
    ranks_per_node=1,
    device_memory=16 * 2**30,
    host_memory=512 * 2**30,
    on_accelerator=True,
)

# flag -> what it means to the planner (changes to BASE, and the gradient checkpointing of the chosen row)
MEANINGS = {
    "--load_in_4bit true": ({"quantization": "4bit"}, False),
    "--load_in_8bit true": ({"quantization": "8bit"}, False),
    "--dtype float32": ({"dtype": torch.float32}, False),
    "--batching padding_free": ({"padding_free": True}, False),
    "--supervised_logits_only false": ({"supervised_logits_only": False}, False),
    "--gradient_checkpointing true": ({}, True),
    "--attn_implementation eager": ({"attn_implementation": "eager"}, False),
    "--per_device_train_batch_size 8": ({"batch_size": 8}, False),
    "--lora_rank 64": ({"lora": replace(BASE.lora, r=64)}, False),
}


def expected_row(changes: dict, checkpointing: bool):
    rows = make_plan(replace(BASE, **changes), {"none": None}, CUDA_CONTEXT_BYTES)
    return next(row for row in rows if row.gradient_checkpointing == checkpointing)


@pytest.mark.parametrize("flag", sorted(MEANINGS))
def test_flag_reaches_the_plan(flag):
    changes, checkpointing = MEANINGS[flag]
    planned = plan_from_flags(*flag.split())
    expected = expected_row(changes, checkpointing)
    assert planned.gradient_checkpointing == checkpointing
    assert planned.estimate.device_items == expected.estimate.device_items
    assert planned.max_batch_size == expected.max_batch_size
    assert planned.estimate.device_items != expected_row({}, False).estimate.device_items, "the flag changes nothing"


def test_max_batch_size_fits_and_one_more_does_not():
    largest = plan_from_flags().max_batch_size
    assert 1 < largest < 4096
    assert plan_from_flags("--per_device_train_batch_size", str(largest)).fits
    assert not plan_from_flags("--per_device_train_batch_size", str(largest + 1)).fits
