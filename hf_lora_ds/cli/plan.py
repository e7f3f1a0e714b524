"""``python -m hf_lora_ds.plan``: will this LoRA run fit, under which ZeRO stage, with what batch?

    python -m hf_lora_ds.plan --model_name_or_path examples/model_configs/qwen2.5-7b-instruct \\
        --max_length 2048 --per_device_train_batch_size 4 --world_size 2 --device_memory 32GiB
    python -m hf_lora_ds.plan examples/qwen2.5-7b-instruct_zero3_2x24gb.yaml --world_size 2 --json

Takes run_sft.py's flags (or its YAML/JSON file, then flags) plus the planner's own (``--world_size``,
``--nnodes``/``--nproc_per_node``, ``--device_memory``, ``--host_memory``, ``--headroom``, ``--json``). Only the
model's config is read, no weight; given ``--train_file`` and a tokenizer beside the config, the data is tokenized as
training tokenizes it (hf_lora_ds.data.run_data) and its real sample lengths are used, else ``--max_length``. Every
other flag set nowhere is the demo's, as for run_sft.py.
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch

from hf_lora_ds.cli.log import configure_logging
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import run_cli
from hf_lora_ds.launch.checks import check_paths
from hf_lora_ds.launch.resolve import read_run_values
from hf_lora_ds.plan.planner import PlanRow, recommend
from hf_lora_ds.plan.run_plan import (
    PlanArguments,
    configs_with,
    plan_run,
    plan_with_more_devices,
    planning_line,
    plans_accelerator,
    sequence_profile,
)
from hf_lora_ds.plan.table import format_table
from hf_lora_ds.resources import DEMO_ARGUMENTS

# run_sft's defaults, but no data unless named: a model planned without --train_file is planned by --max_length.
PLAN_DEFAULTS = {**DEMO_ARGUMENTS, "train_file": None, "eval_file": None}


def parse(argv: list[str]) -> tuple[SFTTrainingArguments, PlanArguments]:
    """run_sft's fields (``unbuilt``: built, they would prepare a launch), with their paths checked as run_sft
    checks them, and the planner's own."""
    values, plan_args = read_run_values(argv, PLAN_DEFAULTS, extra=[PlanArguments])
    check_paths(values)
    return values, plan_args


def main(argv: list[str] | None = None) -> list[PlanRow]:
    args, plan_args = parse(sys.argv[1:] if argv is None else argv)
    if plan_args.device == "auto" and args.device_memory and not torch.accelerator.is_available():
        plan_args.device = "gpu"  # a device memory named on a machine without one: the user plans GPUs
    # The JSON stays parseable on stdout; the lines go to stderr there. The table and its lines are the command's
    # output, printed; the package's own messages are logged.
    lines = sys.stderr if plan_args.json else sys.stdout
    configure_logging(stream="stderr" if plan_args.json else "stdout")
    print(planning_line(args, plan_args), file=lines, flush=True)
    configs = configs_with(args.engine)  # the user's own config gets a row too
    with contextlib.redirect_stdout(sys.stderr):  # library chatter (DeepSpeed logs to stdout) off the table/JSON
        profile = sequence_profile(args)
        rows = plan_run(args, plan_args, profile, configs)
    print(profile.line(), file=lines, flush=True)
    recommended = recommend(rows)
    more_devices = None
    if recommended is None:  # too long for the world planned: how many devices split it (sequence parallelism)
        with contextlib.redirect_stdout(sys.stderr):
            more_devices = plan_with_more_devices(args, plan_args, profile, configs)
    if plan_args.json:
        print(json.dumps([row.as_json() for row in rows], indent=1))
        if more_devices is not None:
            print(f"with more devices: {json.dumps(more_devices.as_json())}", file=sys.stderr)
    else:
        print(format_table(rows, recommended, more_devices, plans_accelerator(plan_args.device, args)))
    return rows


def cli() -> None:
    """``python -m hf_lora_ds.plan``: a user error is one line on stderr and exit code 2 (hf_lora_ds.errors)."""
    run_cli(main)
