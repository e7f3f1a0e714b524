"""Every shipped Accelerate config (accelerate_configs/) and FSDP2 config (fsdp_configs/) is read by the code that
will read it: Accelerate's own config loader (which refuses unknown keys), transformers' FSDP argument processing.
Each Accelerate config is also launched for real: the DeepSpeed ones by tests/e2e/test_accelerate.py, the FSDP2
one by tests/e2e/test_resume.py; fsdp_configs/fsdp2.json by tests/e2e/test_fsdp.py."""

from __future__ import annotations

import json

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType

from hf_lora_ds.resources import ACCELERATE_CONFIGS, FSDP_CONFIGS

ACCELERATE = {"zero2": (2, "none"), "zero3": (3, "none"), "zero3_offload": (3, "cpu"), "fsdp2": None}


def test_the_shipped_sets():
    assert sorted(path.stem for path in ACCELERATE_CONFIGS.glob("*.yaml")) == sorted(ACCELERATE)
    assert sorted(path.stem for path in FSDP_CONFIGS.glob("*.json")) == ["fsdp2", "fsdp2_offload"]


@pytest.mark.parametrize("name", sorted(ACCELERATE))
def test_accelerate_config(name):
    path = ACCELERATE_CONFIGS / f"{name}.yaml"
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith(f"# accelerate launch --config_file accelerate_configs/{name}.yaml run_sft.py")
    config = load_config_from_file(str(path))
    assert config.num_machines == 1 and config.num_processes == 2 and config.mixed_precision == "no"
    if ACCELERATE[name] is None:
        assert config.distributed_type == DistributedType.FSDP
        assert config.fsdp_config["fsdp_version"] == 2
    else:
        stage, offload = ACCELERATE[name]
        assert config.distributed_type == DistributedType.DEEPSPEED
        ds = config.deepspeed_config
        assert ds["zero_stage"] == stage
        assert ds["offload_optimizer_device"] == ds["offload_param_device"] == offload
        assert ds["zero3_init_flag"] is (stage == 3)


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2_offload"])
def test_fsdp_config_is_what_transformers_builds_the_plugin_from(name, tmp_path, monkeypatch):
    from transformers import TrainingArguments

    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")  # transformers exports it; undone after the test

    settings = json.loads((FSDP_CONFIGS / f"{name}.json").read_text())
    assert settings["version"] == 2 and settings["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    args = TrainingArguments(str(tmp_path), fsdp="full_shard", fsdp_config=str(FSDP_CONFIGS / f"{name}.json"))
    plugin = args.fsdp_plugin_args
    assert plugin["fsdp_version"] == 2 and plugin["reshard_after_forward"] is True
    assert plugin["state_dict_type"] == "SHARDED_STATE_DICT"
    assert plugin.get("cpu_offload", False) is (name == "fsdp2_offload")
