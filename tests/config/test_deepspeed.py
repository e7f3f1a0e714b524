"""hf_lora_ds.config.deepspeed: a bad --deepspeed config is refused before loading, naming the key and the flag to
change."""

from __future__ import annotations

import base64
import json

import pytest

from hf_lora_ds.config.deepspeed import (
    check_deepspeed_config,
    deepspeed_config_path,
    known_top_level_keys,
    load_deepspeed_config,
    shipped_deepspeed_names,
)
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.resources import DEEPSPEED_CONFIGS
from tests import REPO

CONFIG_FILES = sorted((REPO / "ds_configs").glob("*.json"))
STAGE2 = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}


def _check(config: dict, micro: int = 4, accumulation: int = 1, world: int = 1) -> None:
    check_deepspeed_config(config, "--deepspeed c.json", micro_batch=micro, accumulation=accumulation, world_size=world)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: path.stem)
@pytest.mark.parametrize(("micro", "accumulation", "world"), [(1, 1, 1), (4, 3, 2), (2, 8, 16)])
def test_every_shipped_config_passes(path, micro, accumulation, world):
    config, source = load_deepspeed_config(str(path))
    assert source == f"--deepspeed {path}"
    _check(config, micro, accumulation, world)


def test_known_keys_come_from_deepspeed():
    keys = known_top_level_keys()
    assert {"zero_optimization", "train_batch_size", "optimizer", "bf16", "gradient_clipping"} <= keys
    assert "zero_optimisation" not in keys


def test_missing_file(tmp_path):
    with pytest.raises(MissingPathError, match=r"--deepspeed .*nope.json: no such file"):
        load_deepspeed_config(str(tmp_path / "nope.json"))


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "zero_optimization": {"stage": 2,}\n}')
    with pytest.raises(UserError, match=r"c.json, line 2 column 36: invalid JSON"):
        load_deepspeed_config(str(path))


def test_not_an_object(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="must be a JSON object"):
        load_deepspeed_config(str(path))


def test_dict_and_base64_are_accepted():
    assert load_deepspeed_config(STAGE2) == (STAGE2, "--deepspeed")
    encoded = base64.urlsafe_b64encode(json.dumps(STAGE2).encode()).decode()
    assert load_deepspeed_config(encoded)[0] == STAGE2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"zero_optimisation": {"stage": 2}},
            r"unknown key 'zero_optimisation' \(did you mean 'zero_optimization'\?\)",
        ),
        (
            {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_save": True}},
            r"unknown key 'zero_optimization.stage3_gather_16bit_weights_on_save' \(did you mean "
            r"'zero_optimization.stage3_gather_16bit_weights_on_model_save'\?\)",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_mem": True}}},
            r"unknown key 'zero_optimization.offload_optimizer.pin_mem' \(did you mean .*pin_memory'\?\)",
        ),
        ({"zero_optimization": {"stage": 4}}, r"zero_optimization.stage is 4; use 0, 1, 2 or 3"),
        ({"zero_optimization": {"stage": "3"}}, r"zero_optimization.stage is '3'"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
            r"offload_optimizer.device is 'gpu'; use one of \['none', 'cpu', 'nvme'\]",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
            r"offload_optimizer without an 'optimizer' section.*\"type\": \"AdamW\"",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            r"offload_param needs ZeRO stage 3 \(stage is 2\)",
        ),
        (
            {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}, "optimizer": {"type": "AdamW"}},
            r"offload_optimizer needs ZeRO stage 1, 2 or 3 \(stage is 0\)",
        ),
        (
            {"train_micro_batch_size_per_gpu": 8},
            r"train_micro_batch_size_per_gpu is 8 but --per_device_train_batch_size "
            r"is 4; set train_micro_batch_size_per_gpu to \"auto\" .* or pass --per_device_train_batch_size 8",
        ),
        (
            {"gradient_accumulation_steps": 2},
            r"gradient_accumulation_steps is 2 but --gradient_accumulation_steps is 1",
        ),
        (
            {"train_batch_size": 16},
            r"train_batch_size is 16 but --per_device_train_batch_size 4 x "
            r"--gradient_accumulation_steps 1 x 2 ranks = 8; .*or pass --gradient_accumulation_steps 2",
        ),
    ],
    ids=[
        "top-level-typo",
        "zero-typo",
        "offload-typo",
        "stage-4",
        "stage-str",
        "offload-device",
        "offload-no-optimizer",
        "offload-param-stage",
        "offload-stage-0",
        "micro-batch",
        "accumulation",
        "train-batch-world",
    ],
)
def test_each_problem_names_the_key_and_the_fix(config, message):
    with pytest.raises(UserError, match=message):
        _check(config, micro=4, accumulation=1, world=2)


def test_train_batch_size_depends_on_the_world_size():
    """16 = 4 x 2 x 2 ranks is right for two ranks and wrong for one: the check uses the launcher's world size."""
    _check({"train_batch_size": 16}, micro=4, accumulation=2, world=2)
    with pytest.raises(UserError, match="x 1 ranks = 8"):
        _check({"train_batch_size": 16}, micro=4, accumulation=2, world=1)


def test_offload_with_forced_cpu_optimizer_off_is_allowed():
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    _check({"zero_optimization": zero, "zero_force_ds_cpu_optimizer": False})


def test_shipped_configs_by_short_name():
    assert deepspeed_config_path("stage3") == str(DEEPSPEED_CONFIGS / "stage3.json")
    assert deepspeed_config_path("stage2_offload.json") == str(DEEPSPEED_CONFIGS / "stage2_offload.json")
    assert shipped_deepspeed_names() == ["stage0", "stage1", "stage2", "stage2_offload", "stage3", "stage3_offload"]
    with pytest.raises(UserError, match="--deepspeed stage7: no such file or shipped config; shipped: stage0, stage1"):
        deepspeed_config_path("stage7")
    assert deepspeed_config_path("some/dir/x.json") == "some/dir/x.json"  # a path: checked where it is read
