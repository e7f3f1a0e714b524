"""Every shipped DeepSpeed config resolves against TrainingArguments with nothing left "auto" and no mismatch.

Validated with the code Trainer itself runs (``HfTrainerDeepSpeedConfig.trainer_config_process`` at
TrainingArguments time, ``trainer_config_finalize`` once the model is known), then with DeepSpeed's own schema
(``DeepSpeedConfig``, which rejects unknown keys and checks the batch arithmetic).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from deepspeed.runtime.config import DeepSpeedConfig
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "ds_configs"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.json"))
EXPECTED = {"stage0", "stage1", "stage2", "stage3", "stage2_offload", "stage3_offload"}

# Keys whose value TrainingArguments owns: a literal here would silently override (or contradict) a CLI flag.
TRAINER_OWNED = [
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.total_num_steps",
    "scheduler.params.warmup_num_steps",
]

# Deliberately unusual values, so a literal that merely equals a default would still be caught as a mismatch.
ARGUMENT_SETS = {
    "fp32": dict(per_device_train_batch_size=3, gradient_accumulation_steps=5, learning_rate=1.23e-4),
    "bf16": dict(per_device_train_batch_size=2, gradient_accumulation_steps=7, max_grad_norm=0.3, bf16=True),
    "fp16": dict(per_device_train_batch_size=1, weight_decay=0.05, adam_beta2=0.95, adam_epsilon=1e-6, fp16=True),
}


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _autos(node, path: str = "") -> list[str]:
    if isinstance(node, dict):
        return [hit for key, value in node.items() for hit in _autos(value, f"{path}.{key}".lstrip("."))]
    return [path] if node == "auto" else []


def _resolve(raw: dict, args: TrainingArguments, hidden_size: int, steps: int = 10) -> dict:
    hf_config = HfTrainerDeepSpeedConfig(copy.deepcopy(raw))
    hf_config.trainer_config_process(args)
    model = type("TinyModel", (), {"config": type("Config", (), {"hidden_size": hidden_size})()})()
    hf_config.trainer_config_finalize(args, model, steps)  # raises ValueError listing any mismatch
    return hf_config.config


@pytest.fixture(autouse=True)
def _no_leaked_deepspeed_config():
    """HfTrainerDeepSpeedConfig registers itself globally (is_deepspeed_zero3_enabled); keep other tests clean."""
    yield
    unset_hf_deepspeed_config()


@pytest.fixture(params=sorted(ARGUMENT_SETS), scope="module")
def training_args(request, tmp_path_factory) -> TrainingArguments:
    # use_cpu: transformers refuses bf16/fp16 flags on a GPU-less machine otherwise; the config logic is the same.
    return TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("args")), report_to="none", use_cpu=True, **ARGUMENT_SETS[request.param]
    )


def test_every_expected_config_is_shipped():
    assert {path.stem for path in CONFIG_FILES} >= EXPECTED


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: path.stem)
def test_trainer_owned_keys_are_auto(path):
    raw = json.loads(path.read_text())
    literal = {key: _get(raw, key) for key in TRAINER_OWNED if _get(raw, key) not in (None, "auto")}
    assert not literal, f'{path.name} hard-codes values TrainingArguments owns; make them "auto": {literal}'
    assert "scheduler" not in raw, f"{path.name}: leave the scheduler to Trainer (lr_scheduler_type, warmup)"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: path.stem)
def test_config_resolves_against_training_arguments(path, training_args):
    resolved = _resolve(json.loads(path.read_text()), training_args, hidden_size=32)

    assert _autos(resolved) == [], f"{path.name}: unresolved auto values"
    micro, accumulation = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    assert resolved["train_micro_batch_size_per_gpu"] == micro
    assert resolved["gradient_accumulation_steps"] == accumulation
    assert resolved["train_batch_size"] == micro * accumulation * training_args.world_size
    assert resolved["gradient_clipping"] == training_args.max_grad_norm
    assert resolved["bf16"]["enabled"] == training_args.bf16
    assert resolved["fp16"]["enabled"] == training_args.fp16
    if "optimizer" in resolved:
        params = resolved["optimizer"]["params"]
        assert params["lr"] == training_args.learning_rate
        assert params["betas"] == [training_args.adam_beta1, training_args.adam_beta2]
        assert params["eps"] == training_args.adam_epsilon
        assert params["weight_decay"] == training_args.weight_decay
    # DeepSpeed's own schema: unknown keys are rejected, batch arithmetic checked for a world of one.
    assert DeepSpeedConfig(resolved).zero_optimization_stage == resolved["zero_optimization"]["stage"]


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: path.stem)
def test_stage_specific_requirements(path):
    zero = json.loads(path.read_text())["zero_optimization"]
    if zero["stage"] == 3:
        # Without it Trainer.save_model writes each rank's empty shard: the classic empty-adapter bug.
        assert zero.get("stage3_gather_16bit_weights_on_model_save") is True
    if "offload_optimizer" in zero:
        # DeepSpeed refuses Trainer's torch optimizer with offload (zero_force_ds_cpu_optimizer): name one here.
        assert json.loads(path.read_text())["optimizer"]["type"].lower() in {"adam", "adamw"}
    if path.stem.endswith("_offload"):
        assert zero["offload_optimizer"]["device"] == "cpu"
    if path.stem == "stage3_offload":
        assert zero["offload_param"]["device"] == "cpu"


def test_a_hard_coded_value_is_reported(training_args):
    """The check above can fail: a literal that disagrees with TrainingArguments is a mismatch."""
    raw = json.loads((CONFIG_DIR / "stage2.json").read_text())
    raw["gradient_accumulation_steps"] = training_args.gradient_accumulation_steps + 1
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        _resolve(raw, training_args, hidden_size=32)
