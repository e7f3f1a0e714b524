"""The answer-accuracy task, the run's own callbacks, and the names the trackers give the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["RUN_CALLBACKS", "ReportingArguments", "check_reporting_fields", "chosen_callbacks"]

# What --run_callbacks may choose: the callbacks hf_lora_ds.callbacks.run_callbacks attaches in the run's order, and
# preemption, the trainer's own (hf_lora_ds.training.preemption).
RUN_CALLBACKS = ("preemption", "engine", "divergence", "sources", "memory", "throughput", "report")


@dataclass
class ReportingArguments:
    """What is scored after training and how the run is named in SwanLab and other trackers."""

    eval_task: str = field(
        default="sum_to_x",
        metadata={"help": "Task that scores generated answers on --eval_file (see hf_lora_ds.eval)."},
    )
    run_callbacks: str = field(
        default="none",
        metadata={
            "help": "The run's own callbacks, comma-separated, 'all' or 'none': preemption (the trainer's own "
            "handling, no callback: SIGTERM/SIGUSR1 save a checkpoint and exit 75; it installs signal handlers while "
            "training), engine (the engine line), divergence "
            "(--on_divergence), sources (per-source sample counts), memory (per phase and rank), throughput "
            "(tokens/s, MFU), report (report.html). The command line's default is 'all'; a LoraSFTTrainer built in "
            "code gets what this names."
        },
    )
    eval_gather_zero3_weights: bool = field(
        default=True,
        metadata={
            "help": "Under ZeRO-3, gather the whole weights once per eval where every rank has room for them (half "
            "its free memory), so generation runs without per-token all-gathers. false: layer by layer at every "
            "decoding step, as in training (slower; for long generations on a model that only just fits)."
        },
    )

    # Redeclared only for their help text: hf_lora_ds.callbacks.swanlab picks the SwanLab names they leave open.
    project: str = field(
        default="huggingface",
        metadata={
            "help": "SwanLab (and Trackio) project. Left at 'huggingface' (transformers' default), SwanLab's is "
            "'<model basename>-lora-sft', e.g. Qwen2.5-0.5B-Instruct-lora-sft, unless SWANLAB_PROJ_NAME is set."
        },
    )
    run_name: str | None = field(
        default=None,
        metadata={
            "help": "Name of the run in SwanLab (and wandb, mlflow, ...). None: SwanLab's run is named after "
            "--output_dir's last folder, unless SWANLAB_EXP_NAME is set."
        },
    )


def chosen_callbacks(spec: str) -> tuple[str, ...]:
    """``--run_callbacks`` as the names it chooses, in the run's order."""
    names = {name.strip() for name in spec.split(",") if name.strip()} - {"none"}
    if "all" in names:
        return RUN_CALLBACKS
    unknown = sorted(names - set(RUN_CALLBACKS))
    if unknown:
        raise UserError(
            f"--run_callbacks {spec}: unknown {unknown}; use 'all', 'none' or names of {list(RUN_CALLBACKS)}"
        )
    return tuple(name for name in RUN_CALLBACKS if name in names)


def check_reporting_fields(args: SFTTrainingArguments) -> None:
    chosen_callbacks(args.run_callbacks)
