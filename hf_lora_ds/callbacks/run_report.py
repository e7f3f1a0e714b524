"""Write ``report.html`` when training ends, from any ``transformers.Trainer``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_lora_ds.callbacks.base import jsonable
from hf_lora_ds.config.engine import engine_of
from hf_lora_ds.distributed import rank_and_world
from hf_lora_ds.report import write_report
from hf_lora_ds.report.argument_table import declared_defaults

__all__ = ["RunReportCallback", "write_run_report"]


def _write(args: TrainingArguments, state: TrainerState, eval_report: Any = None) -> Path | None:
    if rank_and_world()[0] != 0:
        return None
    return write_report(
        args.output_dir,
        state.log_history,
        eval_report=eval_report,
        arguments=args.to_dict(),
        argument_defaults=declared_defaults(args),
        deepspeed_config=jsonable(engine_of(args).deepspeed_config),
    )


def write_run_report(trainer: Trainer, eval_report: dict[str, Any] | str | Path | None = None) -> Path | None:
    """(Re)write ``report.html`` for ``trainer``'s run on rank 0, e.g. once the before/after evaluation is known.

    ``eval_report`` defaults to ``<output_dir>/eval_report.json``. Returns the path on rank 0, None elsewhere.
    """
    return _write(trainer.args, trainer.state, eval_report)


class RunReportCallback(TrainerCallback):
    """Renders ``<output_dir>/report.html`` on rank 0 in ``on_train_end``.

    Register it after MemoryTraceCallback and ThroughputCallback: callbacks run in order, and the report reads what
    their own ``on_train_end`` logged. Accuracy before/after is usually known only after training; call
    ``write_run_report(trainer)`` again once ``eval_report.json`` exists.
    """

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        _write(args, state)
