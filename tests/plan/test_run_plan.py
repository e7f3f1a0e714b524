"""The plan as run_sft uses it: ``--deepspeed auto`` and the stop before loading on an accelerator. A GPU is
simulated (torch says an accelerator is there, so dtype and memory are the GPU's); the CPU launches that exercise
the same code paths for real are tests/e2e/test_launch_matrix.py."""

from __future__ import annotations

from collections import namedtuple

import psutil
import pytest
import torch

from hf_lora_ds.cli.plan import parse
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import UserError
from hf_lora_ds.plan.planner import SHIPPED_CONFIGS_DIR, SequenceProfile
from hf_lora_ds.plan.run_plan import check_run_fits, config_name, configs_with, recommended_deepspeed_config
from hf_lora_ds.resources import MODEL_CONFIGS

MODEL_14B = str(MODEL_CONFIGS / "qwen2.5-14b-instruct")


@pytest.fixture
def two_32gb_gpus(monkeypatch):
    """Rank 0 of 2 on a machine with accelerators and 512 GiB of host memory."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    memory = namedtuple("memory", "total")(512 * 2**30)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}.items():
        monkeypatch.setenv(name, value)


def run_args(*extra: str):
    args, _ = parse(
        [
            "--model_name_or_path",
            MODEL_14B,
            "--device_memory",
            "32GB",
            "--max_length",
            "1024",
            "--per_device_train_batch_size",
            "1",
            *extra,
        ]
    )
    return args


def test_auto_picks_zero3_for_14b_on_two_32gb_gpus(two_32gb_gpus):
    assert (
        recommended_deepspeed_config(run_args("--gradient_checkpointing", "true"))
        == SHIPPED_CONFIGS_DIR / "stage3.json"
    )


def test_auto_without_any_fit_names_the_smallest(two_32gb_gpus):
    with pytest.raises(
        UserError, match=r"--deepspeed auto: no shipped DeepSpeed config fits; the smallest, ds_configs/"
    ):
        recommended_deepspeed_config(run_args("--per_device_train_batch_size", "64"))


def test_auto_names_the_sequence_parallel_size_that_would_fit(two_32gb_gpus):
    """14B with 32k-token samples on 2 x 32 GB: no config holds a whole sequence per GPU; auto does not change the
    global batch by picking a sequence-parallel size itself, it names one."""
    with pytest.raises(
        UserError,
        match=r"no shipped DeepSpeed config fits; .* With --sequence_parallel_size 2, "
        r"ds_configs/stage3\w*.json \+ SP 2 with gradient checkpointing: .* fits",
    ):
        recommended_deepspeed_config(run_args("--max_length", "32768", "--gradient_checkpointing", "true"))


def test_a_run_that_will_not_fit_stops_before_loading(two_32gb_gpus, package_log):
    args = run_args("--deepspeed", str(SHIPPED_CONFIGS_DIR / "stage2.json"), "--gradient_checkpointing", "true")
    with pytest.raises(UserError, match="will not fit: ds_configs/stage2.json with gradient checkpointing") as err:
        check_run_fits(args, SequenceProfile.unknown(1024))
    assert "Would fit: ds_configs/stage3.json with gradient checkpointing" in str(err.value)
    args.check_memory_plan = False  # the override: the plan line, then the run goes on
    row = check_run_fits(args, SequenceProfile.unknown(1024))
    assert not row.fits and row.config == "stage2.json"
    assert package_log.read().count("memory plan: ds_configs/stage2.json with gradient checkpointing") == 2


def test_on_a_cpu_the_plan_line_never_stops_the_run(monkeypatch, package_log):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    args = run_args("--device_memory", "1GiB")
    row = check_run_fits(args, SequenceProfile.unknown(1024))
    assert not row.fits
    assert package_log.read().startswith("memory plan: no DeepSpeed without gradient checkpointing")


def test_the_runs_own_deepspeed_config_is_a_row_named_by_its_file_or_its_zero_setup(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}')
    as_dict = {"zero_optimization": {"stage": 1}}

    def engine(deepspeed=None):
        return SFTTrainingArguments.unbuilt(deepspeed=deepspeed).engine

    assert config_name(engine("stage3")) == "stage3.json"  # a shipped config: its own row
    assert config_name(engine("auto")) == config_name(engine()) == "none"
    assert config_name(engine(as_dict)) == "DeepSpeed ZeRO-1"
    assert configs_with(engine(str(mine)))["mine.json"]["zero_optimization"]["stage"] == 2
    assert configs_with(engine(as_dict))["DeepSpeed ZeRO-1"] is as_dict
