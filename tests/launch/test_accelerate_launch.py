"""An ``accelerate launch`` config becomes this run's own --deepspeed / --fsdp arguments
(hf_lora_ds.launch.accelerate_launch), and what cannot be honoured is refused with one line. The variables are the ones
``accelerate launch`` exports for a config file (seen under accelerate 1.15); the 2-rank launches themselves are in
tests/e2e/test_accelerate.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.errors import UserError
from hf_lora_ds.launch.accelerate_launch import accelerate_launch, adopt_accelerate_launch
from hf_lora_ds.resources import DEEPSPEED_CONFIGS

# accelerate launch --config_file ds_zero3_cpu.yaml (the PEFT guide's), as the script's environment.
ZERO3_CPU = {
    "ACCELERATE_USE_DEEPSPEED": "true",
    "ACCELERATE_CONFIG_DS_FIELDS": "gradient_accumulation_steps,offload_optimizer_device,offload_param_device,"
    "zero3_init_flag,zero3_save_16bit_model,zero_stage,mixed_precision",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4",
    "ACCELERATE_MIXED_PRECISION": "bf16",
}
FSDP2 = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_OFFLOAD_PARAMS": "false",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    "FSDP_MIN_NUM_PARAMS": "100000000",
    "ACCELERATE_MIXED_PRECISION": "no",
}


def run_args(**overrides) -> SimpleNamespace:
    fields = dict(
        deepspeed=None,
        fsdp=None,
        fsdp_config=None,
        gradient_accumulation_steps=1,
        max_grad_norm=1.0,
        bf16=False,
        fp16=False,
    )
    return SimpleNamespace(**{**fields, **overrides})


@pytest.fixture
def launched(monkeypatch):
    def set_environment(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_environment


def test_no_accelerate_launch_changes_nothing():
    args = run_args()
    adopt_accelerate_launch(args)
    assert args == run_args()


def test_the_peft_guides_zero3_cpu_config_becomes_the_runs_deepspeed_config(launched):
    launched(ZERO3_CPU)
    args = run_args()
    adopt_accelerate_launch(args)
    assert ZeroSettings.of(args.deepspeed) == ZeroSettings(3, "cpu", "cpu")
    assert args.deepspeed["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    # DeepSpeed's CPU Adam for the offloaded optimizer (DeepSpeed refuses Trainer's torch AdamW there).
    assert args.deepspeed["optimizer"]["type"] == "AdamW"
    assert args.deepspeed["bf16"] == {"enabled": "auto"}
    json.dumps(args.deepspeed, allow_nan=False)  # a plain JSON config, as a --deepspeed file would be
    assert (args.gradient_accumulation_steps, args.bf16) == (4, True)


def test_accelerate_config_file_pointing_at_a_shipped_config(launched, monkeypatch):
    launched(
        {
            "ACCELERATE_USE_DEEPSPEED": "true",
            "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file",
            "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(DEEPSPEED_CONFIGS / "stage2.json"),
        }
    )
    args = run_args()
    adopt_accelerate_launch(args)
    shipped = json.loads((DEEPSPEED_CONFIGS / "stage2.json").read_text())
    assert args.deepspeed["zero_optimization"] == shipped["zero_optimization"]
    assert "ACCELERATE_CONFIG_DS_FIELDS" not in __import__("os").environ  # consumed, so accelerate takes ours


def test_a_deepspeed_flag_that_disagrees_names_both(launched):
    launched(ZERO3_CPU)
    stage2_path = str(DEEPSPEED_CONFIGS / "stage2.json")
    with pytest.raises(
        UserError,
        match=r"--deepspeed .*stage2.json \(ZeRO-2\) and the Accelerate config .*\(ZeRO-3, "
        r"offload optimizer cpu, parameters cpu\) disagree",
    ):
        adopt_accelerate_launch(run_args(deepspeed=stage2_path, gradient_accumulation_steps=4))


def test_a_deepspeed_flag_that_differs_in_offload_only_is_refused(launched):
    """Same ZeRO stage, no offload in the file: the user's memory plan differs all the same."""
    launched(ZERO3_CPU)
    with pytest.raises(
        UserError,
        match=r"--deepspeed .*stage3.json \(ZeRO-3\) and the Accelerate config .*\(ZeRO-3, "
        r"offload optimizer cpu, parameters cpu\) disagree",
    ):
        adopt_accelerate_launch(
            run_args(deepspeed=str(DEEPSPEED_CONFIGS / "stage3.json"), gradient_accumulation_steps=4)
        )


@pytest.mark.parametrize(("optimizer", "parameters", "cpu_adam"), [("cpu", "none", True), ("none", "cpu", False)])
def test_deepspeeds_cpu_adam_follows_the_optimizer_offload(launched, optimizer, parameters, cpu_adam):
    """Optimizer offload alone needs DeepSpeed's CPU Adam; parameter offload alone keeps Trainer's optimizer."""
    launched(
        {
            **ZERO3_CPU,
            "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": optimizer,
            "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": parameters,
        }
    )
    args = run_args()
    adopt_accelerate_launch(args)
    assert ZeroSettings.of(args.deepspeed) == ZeroSettings(3, optimizer, parameters)
    assert ("optimizer" in args.deepspeed) == cpu_adam


def test_a_deepspeed_flag_that_agrees_is_kept(launched):
    launched(ZERO3_CPU)
    path = str(DEEPSPEED_CONFIGS / "stage3_offload.json")
    args = run_args(deepspeed=path)
    adopt_accelerate_launch(args)
    assert args.deepspeed == path


def test_accumulation_flag_that_contradicts_the_accelerate_config(launched):
    launched(ZERO3_CPU)
    with pytest.raises(UserError, match="--gradient_accumulation_steps 2 and the Accelerate config .*'s 4 disagree"):
        adopt_accelerate_launch(run_args(gradient_accumulation_steps=2))


def test_fsdp2_config_becomes_trainers_fsdp_arguments(launched):
    launched(FSDP2)
    args = run_args()
    adopt_accelerate_launch(args)
    assert args.fsdp == "full_shard"
    assert args.fsdp_config["version"] == 2 and args.fsdp_config["cpu_offload"] is False  # not the string "false"
    assert args.fsdp_config["min_num_params"] == 100000000
    assert args.fsdp_config["state_dict_type"] == "SHARDED_STATE_DICT"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"ACCELERATE_USE_MEGATRON_LM": "true"}, "distributed_type MEGATRON_LM is not supported"),
        ({**FSDP2, "FSDP_VERSION": "1"}, "fsdp_version 1; hf_lora_ds runs FSDP2 only"),
        ({**FSDP2, "ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed and FSDP at once"),
    ],
    ids=["megatron", "fsdp1", "both"],
)
def test_what_cannot_run_is_refused_naming_the_config(launched, variables, message):
    launched(variables)
    with pytest.raises(UserError, match=f"^Accelerate config .*{message}"):
        accelerate_launch()


def test_an_fsdp1_config_under_an_fsdp2_launch_is_refused(launched):
    launched(FSDP2)
    with pytest.raises(UserError, match="^Accelerate config .* asks for FSDP2 and --fsdp_config does not"):
        adopt_accelerate_launch(run_args(fsdp="full_shard", fsdp_config={"fsdp_version": 1}))


def test_fsdp_config_with_a_deepspeed_flag_is_refused(launched):
    launched(FSDP2)
    with pytest.raises(UserError, match="asks for FSDP and --deepspeed stage2.json for DeepSpeed: choose one"):
        adopt_accelerate_launch(run_args(deepspeed="stage2.json"))
