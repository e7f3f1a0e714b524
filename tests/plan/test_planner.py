"""The plan's rows: the data's worst batch, the shipped configurations in the recommendation's order, the pick."""

from __future__ import annotations

import copy

import torch
from peft import LoraConfig, TaskType

from hf_lora_ds.model.source import load_model_config
from hf_lora_ds.plan.estimate import BatchShape, Estimate
from hf_lora_ds.plan.planner import (
    CUDA_CONTEXT_BYTES,
    PlanRow,
    PlanSettings,
    SequenceProfile,
    is_fsdp,
    make_plan,
    recommend,
    shipped_configs,
)
from hf_lora_ds.resources import MODEL_CONFIGS


def test_the_worst_batch_holds_the_longest_samples():
    profile = SequenceProfile.from_samples(lengths=(10, 300, 50, 200), supervised=(5, 100, 40, 150))
    assert profile.worst_batch(2, padding_free=False) == BatchShape(rows=2, row_tokens=300, supervised_tokens=250)
    assert profile.worst_batch(2, padding_free=True) == BatchShape(rows=1, row_tokens=500, supervised_tokens=250)
    assert profile.worst_batch(6, padding_free=False).supervised_tokens == 295 + 2 * 150
    # Packed: full rows of max_length, with at most every supervised token of the data in them.
    assert profile.worst_batch(2, padding_free=False, packed_length=256) == BatchShape(2, 256, 295)
    assert profile.worst_batch(1, padding_free=False, packed_length=128).supervised_tokens == 128


def test_the_profile_says_what_it_knows_of_the_data():
    assert SequenceProfile.from_samples((10, 57, 3), (4, 20, 2)).line() == (
        "data: 3 samples, longest 57 tokens, at most 20 supervised"
    )
    unknown = SequenceProfile.unknown(2048)
    assert not unknown.known and unknown.line().endswith("every sample taken as 2048 tokens")
    assert unknown.worst_batch(2, padding_free=False) == BatchShape(rows=2, row_tokens=2048, supervised_tokens=4096)


def test_shipped_configurations_come_fastest_first_and_the_first_that_fits_is_recommended():
    names = list(shipped_configs())
    assert names[0] == "none" and names.index("stage0.json") < names.index("stage3_offload.json")
    assert is_fsdp(shipped_configs()["fsdp2.json"]) and not is_fsdp(shipped_configs()["stage2.json"])
    rows = [row(name, fits) for name, fits in (("none", False), ("stage2.json", True), ("stage3.json", True))]
    assert recommend(rows).config == "stage2.json"
    assert recommend(rows[:1]) is None


def row(config: str, fits: bool) -> PlanRow:
    return PlanRow(
        config, False, Estimate({"weights": 2**30}, {"loading": 2**31}), fits, 2**29 if fits else -(2**29), 4
    )


def test_zero3_rows_count_what_zero2_s_do():
    """ZeRO-3's steps keep what ZeRO-2's keep (the run's ZeRO-3 linear keeps only a trained weight's input:
    hf_lora_ds.training.zero3_linear), with ``memory_efficient_linear`` on or off."""
    configs = shipped_configs()
    plain_linear = copy.deepcopy(configs["stage3.json"])
    plain_linear["zero_optimization"]["memory_efficient_linear"] = False
    settings = PlanSettings(
        model_config=load_model_config(str(MODEL_CONFIGS / "qwen2.5-0.5b-instruct"), False),
        lora=LoraConfig(
            task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear"
        ),
        dtype=torch.bfloat16,
        batch_size=2,
        profile=SequenceProfile.from_samples([512] * 4, [256] * 4),
        world_size=1,
        ranks_per_node=1,
        device_memory=80 * 2**30,
        host_memory=512 * 2**30,
        on_accelerator=True,
    )
    plan = {"stage2.json": configs["stage2.json"], "stage3.json": configs["stage3.json"], "plain": plain_linear}
    activations = {
        row.config: row.estimate.device_items["activations"]
        for row in make_plan(settings, plan, CUDA_CONTEXT_BYTES)
        if not row.gradient_checkpointing
    }
    assert activations["stage3.json"] == activations["stage2.json"] == activations["plain"]
