"""The resolved DeepSpeed config (what SwanLab and report.html record) and the JSON conversion behind it."""

from __future__ import annotations

import enum

from transformers import TrainingArguments

from hf_lora_ds.callbacks.base import jsonable
from hf_lora_ds.config.engine import engine_of


def test_deepspeed_auto_values_are_resolved_from_the_arguments(tmp_path):
    written = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "zero_optimization": {"stage": 2},
    }
    args = TrainingArguments(
        output_dir=str(tmp_path), deepspeed=written, use_cpu=True, per_device_train_batch_size=3, learning_rate=2e-4
    )
    resolved = jsonable(engine_of(args).deepspeed_config)
    assert resolved["train_micro_batch_size_per_gpu"] == 3
    assert resolved["optimizer"]["params"]["lr"] == 2e-4
    assert resolved["zero_optimization"] == {"stage": 2}


def test_no_deepspeed_means_no_config(tmp_path):
    assert jsonable(engine_of(TrainingArguments(output_dir=str(tmp_path), use_cpu=True)).deepspeed_config) is None


def test_jsonable_turns_sets_and_enums_into_json_types():
    class Kind(enum.Enum):
        LORA = "LORA"

    assert jsonable({"modules": {"v_proj", "q_proj"}, "kind": Kind.LORA, "other": object}) == {
        "modules": ["q_proj", "v_proj"],
        "kind": "LORA",
        "other": str(object),
    }
