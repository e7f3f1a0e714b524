"""What ``accelerate launch --config_file`` asked for, made into this run's own arguments before anything reads them.

``accelerate launch`` hands its config over as environment variables, and transformers builds the DeepSpeed engine
from them while ``TrainingArguments.deepspeed`` stays empty, so every check keyed on ``--deepspeed`` (world size,
memory plan, resume, the run report) would be blind to it. Here the DeepSpeed settings become one config in
``args.deepspeed`` (read by accelerate's own ``DeepSpeedPlugin``, so the keys mean what they mean to accelerate) and an
FSDP config becomes ``--fsdp``/``--fsdp_config``. What cannot be honoured is refused before any model is loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.deepspeed import load_deepspeed_config
from hf_lora_ds.config.fsdp import fsdp_settings, fsdp_version_2
from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.errors import UserError
from hf_lora_ds.resources import DEEPSPEED_CONFIGS

__all__ = [
    "AccelerateLaunch",
    "accelerate_launch",
    "adopt_accelerate_launch",
]

_TRUE = ("1", "true", "yes")
# distributed_type values accelerate launch announces through a variable of its own, none of which this package runs.
_UNSUPPORTED = {
    "ACCELERATE_USE_MEGATRON_LM": "MEGATRON_LM",
    "ACCELERATE_USE_XLA": "XLA",
    "ACCELERATE_USE_SAGEMAKER": "SAGEMAKER",
}
# Accelerate's FSDP variables -> transformers' fsdp_config keys (transformers adds the "fsdp_" prefix back).
_FSDP_KEYS = {
    "FSDP_VERSION": "version",
    "FSDP_OFFLOAD_PARAMS": "cpu_offload",
    "FSDP_RESHARD_AFTER_FORWARD": "reshard_after_forward",
    "FSDP_AUTO_WRAP_POLICY": "auto_wrap_policy",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "transformer_layer_cls_to_wrap",
    "FSDP_MIN_NUM_PARAMS": "min_num_params",
    "FSDP_STATE_DICT_TYPE": "state_dict_type",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "cpu_ram_efficient_loading",
    "FSDP_ACTIVATION_CHECKPOINTING": "activation_checkpointing",
}


@dataclass
class AccelerateLaunch:
    """The engine an ``accelerate launch`` config asked for: ``deepspeed`` (the effective DeepSpeed config, ``"auto"``
    values left for Trainer) or ``fsdp`` (transformers' ``fsdp_config``), named after its config file."""

    source: str
    deepspeed: dict | None = None
    fsdp: dict | None = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    mixed_precision: str = "no"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def accelerate_launch() -> AccelerateLaunch | None:
    """The DeepSpeed or FSDP settings ``accelerate launch`` put into this process's environment, or None."""
    for variable, kind in _UNSUPPORTED.items():
        if _flag(variable):
            raise UserError(
                f"{_config_source()}: distributed_type {kind} is not supported by hf_lora_ds; use "
                "DEEPSPEED, FSDP (fsdp_version 2), MULTI_GPU or MULTI_CPU"
            )
    use_deepspeed, use_fsdp = _flag("ACCELERATE_USE_DEEPSPEED"), _flag("ACCELERATE_USE_FSDP")
    if not (use_deepspeed or use_fsdp):
        return None
    launch = AccelerateLaunch(
        source=_config_source(), mixed_precision=os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    )
    if use_deepspeed and use_fsdp:
        raise UserError(f"{launch.source}: DeepSpeed and FSDP at once; choose one distributed_type")
    if use_deepspeed:
        launch.deepspeed = _deepspeed_from_environment(launch.source)
        accumulation = launch.deepspeed.get("gradient_accumulation_steps")
        clipping = launch.deepspeed.get("gradient_clipping")
        launch.gradient_accumulation_steps = accumulation if isinstance(accumulation, int) else None
        launch.gradient_clipping = float(clipping) if isinstance(clipping, (int, float)) else None
    else:
        launch.fsdp = {key: _value(os.environ[name]) for name, key in _FSDP_KEYS.items() if os.environ.get(name)}
        if str(launch.fsdp.get("version", "1")) != "2":
            raise UserError(
                f"{launch.source}: fsdp_version {launch.fsdp.get('version', 1)}; hf_lora_ds runs FSDP2 "
                "only (fsdp_version: 2)"
            )
        launch.fsdp["version"] = 2
        steps = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
        launch.gradient_accumulation_steps = int(steps) if steps else None
    return launch


def _value(text: str) -> bool | int | str:
    """An FSDP variable's text as the type transformers' fsdp_config holds ("false" is truthy as a string)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return int(text) if text.isdigit() else text


def _deepspeed_from_environment(source: str) -> dict:
    """The DeepSpeed config accelerate's own ``DeepSpeedPlugin`` builds from the launch variables (or the
    ``deepspeed_config_file`` they name). Its ``"auto"`` batch keys are left for Trainer to fill."""
    from accelerate.utils import DeepSpeedPlugin

    try:
        plugin = DeepSpeedPlugin()
    except (ValueError, OSError) as err:
        raise UserError(f"{source}: accelerate cannot build its DeepSpeed config ({err})") from None
    config = dict(plugin.deepspeed_config)
    if config.get("steps_per_print") == float("inf"):
        del config["steps_per_print"]  # accelerate's "never"; not JSON, and DeepSpeed's default prints rarely anyway
    zero = config.get("zero_optimization", {})
    for section in ("offload_optimizer", "offload_param"):
        if isinstance(zero.get(section), dict) and zero[section].get("nvme_path") is None:
            zero[section].pop("nvme_path", None)
    # Mixed precision through Trainer's flags (set from ACCELERATE_MIXED_PRECISION), as in the shipped configs.
    for precision in ("bf16", "fp16"):
        config.setdefault(precision, {"enabled": "auto"})
    if ZeroSettings.of(config).offloads_optimizer and "optimizer" not in config:
        # DeepSpeed refuses Trainer's torch AdamW under optimizer offload (zero_force_ds_cpu_optimizer); its own
        # CPU Adam, which the offload is built for, is what ds_configs/stage*_offload.json name too.
        config["optimizer"] = json.loads((DEEPSPEED_CONFIGS / "stage3_offload.json").read_text())["optimizer"]
    return config


def _config_source() -> str:
    """The Accelerate config file the launcher read, for messages: its ``--config_file`` (read from the launcher
    process, this process's parent, which exported no name for it), else accelerate's default config file."""
    try:
        arguments = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        arguments = []
    for position, argument in enumerate(arguments):
        if argument in ("--config_file", "--config-file") and position + 1 < len(arguments):
            return f"Accelerate config {arguments[position + 1]}"
        if argument.startswith(("--config_file=", "--config-file=")):
            return f"Accelerate config {argument.split('=', 1)[1]}"
    return "Accelerate config (accelerate launch's default config file)"


def adopt_accelerate_launch(args: SFTTrainingArguments) -> None:
    """Make an ``accelerate launch`` config this run's own arguments (see the module docstring), on the parsed
    values, before ``SFTTrainingArguments`` is built from them."""
    launch = accelerate_launch()
    if launch is None:
        return
    if launch.fsdp is not None and args.deepspeed:
        raise UserError(f"{launch.source} asks for FSDP and --deepspeed {args.deepspeed} for DeepSpeed: choose one")
    if launch.deepspeed is not None:
        given = args.deepspeed and args.deepspeed != "auto"  # auto: the launch's own config is the pick
        deepspeed_file = load_deepspeed_config(args.deepspeed)[0] if given else None
        if deepspeed_file is not None and ZeroSettings.of(deepspeed_file) != ZeroSettings.of(launch.deepspeed):
            raise UserError(
                f"--deepspeed {args.deepspeed} ({ZeroSettings.of(deepspeed_file).describe()}) and the {launch.source} "
                f"({ZeroSettings.of(launch.deepspeed).describe()}) disagree; drop one, or make them name the same ZeRO "
                "setup"
            )
        if deepspeed_file is None:
            args.deepspeed = launch.deepspeed
        # Consumed: accelerate refuses a config file (ours, now) while its own DeepSpeed fields are still announced.
        os.environ.pop("ACCELERATE_CONFIG_DS_FIELDS", None)
    if launch.fsdp is not None:
        if args.fsdp and not fsdp_version_2(args.fsdp_config):
            raise UserError(f"{launch.source} asks for FSDP2 and --fsdp_config does not: drop one of them")
        args.fsdp = args.fsdp or "full_shard"
        args.fsdp_config = {**launch.fsdp, **fsdp_settings(args.fsdp_config)}
    _adopt_number(args, "gradient_accumulation_steps", launch.gradient_accumulation_steps, 1, launch.source)
    _adopt_number(args, "max_grad_norm", launch.gradient_clipping, 1.0, launch.source)
    if launch.mixed_precision in ("bf16", "fp16") and not (args.bf16 or args.fp16):
        setattr(args, launch.mixed_precision, True)


def _adopt_number(args: SFTTrainingArguments, name: str, launched: float | None, default: float, source: str) -> None:
    """The launcher's value where the flag was left at its default; a flag set to another value is a contradiction."""
    if launched is None or getattr(args, name) == launched:
        return
    if getattr(args, name) != default:
        raise UserError(f"--{name} {getattr(args, name)} and the {source}'s {launched} disagree; drop one of them")
    setattr(args, name, type(default)(launched))
