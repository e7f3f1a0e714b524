"""hf_lora_ds.config.zero_settings: the ZeRO stage and offloads of a DeepSpeed config, read one way."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.resources import DEEPSPEED_CONFIGS


@pytest.mark.parametrize(
    ("name", "stage", "optimizer", "params"),
    [
        ("stage0", 0, "none", "none"),
        ("stage2", 2, "none", "none"),
        ("stage2_offload", 2, "cpu", "none"),
        ("stage3", 3, "none", "none"),
        ("stage3_offload", 3, "cpu", "cpu"),
    ],
)
def test_the_shipped_configs(name, stage, optimizer, params):
    zero = ZeroSettings.of(json.loads((DEEPSPEED_CONFIGS / f"{name}.json").read_text()))
    assert (zero.stage, zero.optimizer_device, zero.param_device) == (stage, optimizer, params)
    assert (zero.offloads_optimizer, zero.offloads_params) == (optimizer != "none", params != "none")


def test_no_deepspeed_and_sections_without_a_device():
    assert ZeroSettings.of(None) == ZeroSettings.of({}) == ZeroSettings(0, "none", "none")
    config = {
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "none"},
            "offload_optimizer": {},
            "reduce_scatter": False,
        }
    }
    zero = ZeroSettings.of(config)
    assert (zero.offloads_params, zero.offloads_optimizer, zero.reduce_scatter) == (False, False, False)


def test_describe():
    assert ZeroSettings(3, "cpu", "nvme").describe() == "ZeRO-3, offload optimizer cpu, parameters nvme"
    assert ZeroSettings(2).describe() == "ZeRO-2"


def test_zero3_s_own_linear_is_on_unless_the_config_turns_it_off():
    assert ZeroSettings.of({"zero_optimization": {"stage": 3}}).zero3_linear
    assert not ZeroSettings.of({"zero_optimization": {"stage": 3, "memory_efficient_linear": False}}).zero3_linear
    assert not ZeroSettings.of({"zero_optimization": {"stage": 2}}).zero3_linear
    assert not ZeroSettings.of(None).zero3_linear
