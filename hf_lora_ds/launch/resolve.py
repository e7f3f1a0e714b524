"""The one resolution of a run. From a command line, each step once and in this order: defaults, a YAML/JSON file
given first, flags over it; an ``accelerate launch`` config adopted and ``--deepspeed auto`` planned; the run's checks
(``check_run``: the files, the DeepSpeed config, the launch and the model's config); the process environment prepared
for the launcher; ``SFTTrainingArguments`` built; the world size made to agree with DeepSpeed's.

From code, ``SFTTrainingArguments(...)`` checks its values alone and ``LoraSFTTrainer`` runs ``resolve_arguments`` on
it before anything loads: the same ``check_run``, the same one-line refusal with the field named as in code
(``lora_optimizer="lorafa"``, hf_lora_ds.config.naming). ``--resume_from_checkpoint`` is resolved by the trainer,
before it loads the data and the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import yaml
from transformers import HfArgumentParser
from transformers.utils import logging

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.arguments import check_field_values
from hf_lora_ds.config.deepspeed import (
    check_deepspeed_config,
    deepspeed_config_path,
    load_deepspeed_config,
)
from hf_lora_ds.config.engine import data_parallel_size, engine_of
from hf_lora_ds.config.fsdp import fsdp_settings
from hf_lora_ds.config.naming import from_command_line, named_as_given
from hf_lora_ds.config.quantization import quantization_flag
from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.devices import available_accelerator
from hf_lora_ds.distributed import launcher_world_size
from hf_lora_ds.errors import MissingPathError, UserError, one_line
from hf_lora_ds.launch.accelerate_launch import adopt_accelerate_launch
from hf_lora_ds.launch.checks import (
    check_command_line_needs,
    check_run_values,
    check_sequence_parallel,
    check_training_flags,
)
from hf_lora_ds.launch.world import ensure_world_agreement, prepare_distributed
from hf_lora_ds.model.lora_variants import check_lora_optimizer_engine
from hf_lora_ds.plan.run_plan import recommended_deepspeed_config
from hf_lora_ds.resources import DEMO_ARGUMENTS
from hf_lora_ds.training.sequence_parallel import deepspeed_gradient_divisor

__all__ = [
    "ARGUMENT_FILE_SUFFIXES",
    "build_run_arguments",
    "parse_run_arguments",
    "read_arguments_file",
    "read_checked_values",
    "read_run_values",
    "resolve_arguments",
    "resolve_launch",
    "resolve_run",
]

logger = logging.get_logger(__name__)

ARGUMENT_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def read_arguments_file(path: Path) -> dict:
    """The file's keys, refused by name when one is not an argument (a typo would otherwise be ignored)."""
    if not path.is_file():
        raise MissingPathError(f"{path}: no such config file; pass a YAML/JSON file of arguments, or flags")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a readable YAML/JSON file ({one_line(str(err))})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: expected a mapping of argument names to values, got {type(config).__name__}")
    unknown = sorted(set(config) - {known.name for known in fields(SFTTrainingArguments)})
    if unknown:
        raise UserError(f"{path}: unknown argument(s) {unknown}; see python run_sft.py --help")
    return config


def read_run_values(argv: Sequence[str], defaults: dict | None = None, extra: Sequence[type] = ()) -> tuple:
    """``(SFTTrainingArguments, *extra)``: every field of the run (and of each ``extra`` dataclass) as parsed:
    ``defaults``, a YAML/JSON file of arguments when it comes first, then the flags. The run's arguments are
    ``unbuilt``: nothing is checked or set up yet."""
    argv = list(argv)
    values = dict(defaults or {})
    if argv and argv[0].endswith(ARGUMENT_FILE_SUFFIXES):
        values.update(read_arguments_file(Path(argv[0])))
        argv = argv[1:]
    parser = HfArgumentParser([SFTTrainingArguments, *extra])
    parser.set_defaults(**values)
    parsed, unknown = parser.parse_known_args(argv)
    if unknown:
        raise UserError(f"unknown argument(s) {unknown}; see --help")
    # Each dataclass takes its own fields, as HfArgumentParser's parse_args_into_dataclasses does, but the run's
    # arguments are made unbuilt: building them would set up the launch before it is resolved.
    run, *others = (
        {f.name: getattr(parsed, f.name) for f in fields(kind) if f.init} for kind in (SFTTrainingArguments, *extra)
    )
    return (SFTTrainingArguments.unbuilt(**run), *(kind(**own) for kind, own in zip(extra, others)))


def read_checked_values(argv: Sequence[str]) -> SFTTrainingArguments:
    """run_sft's fields (demo defaults, a YAML/JSON file, flags), checked as a run checks them before launching: for
    the commands that describe a run without launching it (the audit), on arguments left ``unbuilt`` (built, they
    would prepare a launch)."""
    (values,) = read_run_values(argv, DEMO_ARGUMENTS)
    check_command_line_needs(values)
    check_field_values(values)
    check_run_values(values)
    return values


def resolve_launch(values: SFTTrainingArguments) -> None:
    """The engine the run asked for, decided from its values: an ``accelerate launch`` DeepSpeed or FSDP config
    becomes ``--deepspeed`` or ``--fsdp`` (or stops on a contradiction), and ``--deepspeed auto`` the memory plan's
    first shipped config that fits; ``values.engine`` is decided again from what they became."""
    adopt_accelerate_launch(values)
    if values.deepspeed == "auto":
        values.deepspeed = str(recommended_deepspeed_config(values))
        logger.info(f"--deepspeed auto: {values.deepspeed} (the memory plan's pick)")
    values.engine = engine_of(values)


def check_engine(values: SFTTrainingArguments) -> None:
    """The DeepSpeed or FSDP config, read once and checked before transformers parses it (its errors come later and
    name neither the key nor the flag to change), against the batch, the LoRA optimizer and a quantized base; a
    shipped config's short name (``stage3``) becomes its path."""
    config, source = {}, ""
    if values.deepspeed:
        if isinstance(values.deepspeed, str):
            values.deepspeed = deepspeed_config_path(values.deepspeed)
        config, source = load_deepspeed_config(values.deepspeed)
        world_size = launcher_world_size()
        check_deepspeed_config(
            config,
            source,
            micro_batch=values.per_device_train_batch_size,
            accumulation=values.gradient_accumulation_steps,
            world_size=data_parallel_size(world_size, values.sequence_parallel_size),
        )
        if values.sequence_parallel_size > 1:
            deepspeed_gradient_divisor(
                config, world_size, values.sequence_parallel_size
            )  # refuses what it cannot scale
    zero = ZeroSettings.of(config)
    check_lora_optimizer_engine(values, zero.stage if values.deepspeed else None, "optimizer" in config, source)
    if values.fsdp:
        _check_fsdp(values)
    if (values.load_in_4bit or values.load_in_8bit) and zero.offloads_params:
        # Observed: a 4-bit base under ds_configs/stage3_offload.json trains, then hangs in the final save. And a
        # base quantized to fit the GPU gains nothing from being moved to CPU memory.
        named = "" if source == "--deepspeed" else f" in {source}"  # a dict: adopted from accelerate launch
        raise UserError(
            f"{quantization_flag(values)} with a DeepSpeed config that offloads parameters (DeepSpeed "
            f"{zero.describe()}){named}: use ds_configs/stage3.json (or stage2_offload.json to "
            "offload the optimizer state only)"
        )


def _check_fsdp(values: SFTTrainingArguments) -> None:
    """FSDP2 only (transformers' own default); parameter offload only where there is an accelerator to offload
    from (on a CPU-only machine torch's CPUOffloadPolicy fails after loading: no accelerator device)."""
    settings = fsdp_settings(values.fsdp_config)
    if str(settings.get("version", 2)) != "2":
        raise UserError(f"--fsdp_config version {settings['version']}: hf_lora_ds runs FSDP2 (version 2) only")
    if settings.get("cpu_offload") and available_accelerator() is None:
        raise UserError(
            "FSDP cpu_offload moves parameters from an accelerator to host memory, and this machine "
            "has none: drop cpu_offload (fsdp_configs/fsdp2.json)"
        )


def check_run(args: SFTTrainingArguments) -> None:
    """The checks of the run around its values, in the order a user would fix them: the files and the data format,
    the non-numeric flags, the DeepSpeed or FSDP config against the rest, sequence parallelism against the launch and
    the model. Every route into a run passes here (see the module docstring)."""
    check_run_values(args)
    check_training_flags(args)
    check_engine(args)
    check_sequence_parallel(args, launcher_world_size())


def resolve_run(values: SFTTrainingArguments) -> SFTTrainingArguments:
    """The run's arguments built from its ``unbuilt`` values, resolved and checked, with the process ready for its
    launcher (see the module docstring). A ``ValueError`` raised while they are built is a bad flag or combination
    (ours or TrainingArguments'), so it becomes a ``UserError``: one line, exit code 2."""
    try:
        with named_as_given(values):
            resolve_launch(values)
            check_field_values(values)
            check_run(values)
        prepare_distributed(values)  # the run's one change to the process environment
        args = values.built()
    except UserError:
        raise
    except ValueError as err:
        raise UserError(str(err)) from err
    args.resolved = True
    ensure_world_agreement(args)
    return args


def resolve_arguments(args: SFTTrainingArguments) -> SFTTrainingArguments:
    """``args`` built in code, checked as a command line's are (``check_run``), once: ``LoraSFTTrainer`` calls it
    before it loads anything; arguments already ``resolved`` (by ``parse_run_arguments``) pass as they are."""
    if not args.resolved:
        with named_as_given(args):
            check_run(args)
        args.resolved = True
    return args


def parse_run_arguments(argv: Sequence[str], defaults: dict | None = None) -> SFTTrainingArguments:
    """The run's arguments from a command line (``defaults`` under a YAML/JSON file and the flags), resolved; a
    refusal names the flag."""
    with from_command_line():
        try:
            (values,) = read_run_values(argv, defaults)
        except ValueError as err:
            raise UserError(str(err)) from err
        check_command_line_needs(values)
        return resolve_run(values)


def build_run_arguments(**values: object) -> SFTTrainingArguments:
    """The run's arguments from keyword values (the fields' defaults for the rest), resolved as a command line is:
    for scripts and notebooks that build a run in code."""
    unknown = sorted(set(values) - {f.name for f in fields(SFTTrainingArguments) if f.init})
    if unknown:
        raise UserError(f"unknown argument(s) {unknown}")
    return resolve_run(SFTTrainingArguments.unbuilt(**values))
