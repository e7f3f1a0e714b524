"""The answer-accuracy task and the names the trackers give the run."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReportingArguments"]


@dataclass
class ReportingArguments:
    """What is scored after training and how the run is named in SwanLab and other trackers."""

    eval_task: str = field(
        default="sum_to_x",
        metadata={"help": "Task that scores generated answers on --eval_file (see hf_lora_ds.eval)."},
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
