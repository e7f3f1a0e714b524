"""From a command line to a run's arguments: the one way run_sft.py, its installed command ``hf-lora-sft`` and
``python -m hf_lora_ds.plan`` read theirs.

The order is the point, and all of it is here, each step once: defaults, then a YAML/JSON file given first, then flags
over it; an ``accelerate launch`` config adopted and ``--deepspeed auto`` resolved by the memory planner (both need
only those values); the process environment prepared for the launcher; only then ``SFTTrainingArguments``, which
checks every field and whose ``TrainingArguments.__post_init__`` builds accelerate's process state from that
environment; and right after it, the world size made to agree with DeepSpeed's, before any model is loaded.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from transformers import HfArgumentParser

from hf_lora_ds.distributed import print0
from hf_lora_ds.errors import UserError
from hf_lora_ds.launch.accelerate_launch import adopt_accelerate_launch
from hf_lora_ds.launch.arguments import SFTTrainingArguments, read_arguments_file
from hf_lora_ds.launch.checks import check_fields
from hf_lora_ds.launch.world import ensure_world_agreement, prepare_distributed
from hf_lora_ds.plan.run_plan import recommended_deepspeed_config
from hf_lora_ds.resources import DEMO_ARGUMENTS

__all__ = ["ARGUMENT_FILE_SUFFIXES", "parse_run_arguments", "read_checked_values", "read_run_values", "resolve_launch"]

ARGUMENT_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def read_run_values(argv: Sequence[str], defaults: dict | None = None, extra: Sequence[type] = ()) -> Namespace:
    """Every field of ``SFTTrainingArguments`` (and of the ``extra`` dataclasses) as parsed values: ``defaults``, a
    YAML/JSON file of arguments when it comes first, then the flags. Builds no dataclass."""
    argv = list(argv)
    values = dict(defaults or {})
    if argv and argv[0].endswith(ARGUMENT_FILE_SUFFIXES):
        values.update(read_arguments_file(Path(argv[0])))
        argv = argv[1:]
    parser = HfArgumentParser([SFTTrainingArguments, *extra])
    parser.set_defaults(**values)
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        raise UserError(f"unknown argument(s) {unknown}; see --help")
    return namespace


def read_checked_values(argv: Sequence[str], extra: Sequence[type] = ()) -> Namespace:
    """run_sft's fields (demo defaults, a YAML/JSON file, flags), and the ``extra`` dataclasses' fields, checked as
    ``SFTTrainingArguments`` checks them: for the commands that describe a run without launching it (the audit, the
    planner), which build no arguments object (that would prepare a launch)."""
    values = read_run_values(argv, DEMO_ARGUMENTS, extra)
    check_fields(values)
    return values


def resolve_launch(values: Namespace) -> None:
    """The engine the run asked for, decided from its values: an ``accelerate launch`` DeepSpeed or FSDP config
    becomes ``--deepspeed`` or ``--fsdp`` (or stops on a contradiction), and ``--deepspeed auto`` the memory plan's
    first shipped config that fits."""
    adopt_accelerate_launch(values)
    if values.deepspeed == "auto":
        values.deepspeed = str(recommended_deepspeed_config(values))
        print0(f"--deepspeed auto: {values.deepspeed} (the memory plan's pick)")


def parse_run_arguments(argv: Sequence[str], defaults: dict | None = None) -> SFTTrainingArguments:
    """The run's arguments, resolved and checked, with the process ready for its launcher (see the module docstring).
    A ``ValueError`` raised while they are built is a bad flag or combination (ours or TrainingArguments'), so it
    becomes a ``UserError``: one line, exit code 2."""
    try:
        values = read_run_values(argv, defaults)
        resolve_launch(values)
        prepare_distributed(values)  # the run's one change to the process environment
        args = SFTTrainingArguments(**{f.name: getattr(values, f.name) for f in fields(SFTTrainingArguments) if f.init})
    except UserError:
        raise
    except ValueError as err:
        raise UserError(str(err)) from err
    ensure_world_agreement(args)
    return args
