"""The run's own callbacks, attached to its trainer after the ones it was given, in the order they must run.

Some callbacks read what others did in the same event, so the order of ``trainer.callback_handler.callbacks`` is part
of what they mean (``attach_run_callbacks`` says why each goes where). The run's own callbacks are the ones
``--run_callbacks`` names (the command line's default: all; a trainer built in code: what its arguments name); the
checkpoint completion marker always goes, ``--resume_from_checkpoint auto`` trusts it. The callbacks a caller passed
keep their places and their order: a kind among them is the one used, never made a second time. They observe the
run; what decides it (the adapter check, preemption, the final save) is the trainer's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import Trainer, TrainerCallback

from hf_lora_ds.callbacks.accuracy import AnswerAccuracyCallback
from hf_lora_ds.callbacks.base import LoggingCallback
from hf_lora_ds.callbacks.checkpoint_completion import CheckpointCompletionCallback
from hf_lora_ds.callbacks.data_sources import SourceCountsLog
from hf_lora_ds.callbacks.divergence import DivergenceCallback
from hf_lora_ds.callbacks.engine_line import EngineCallback
from hf_lora_ds.callbacks.memory import MemoryTraceCallback
from hf_lora_ds.callbacks.run_report import RunReportCallback
from hf_lora_ds.callbacks.throughput import ThroughputCallback
from hf_lora_ds.config.reporting import chosen_callbacks

__all__ = ["attach_run_callbacks"]


def attach_run_callbacks(trainer: Trainer, made: Sequence[TrainerCallback] = ()) -> None:
    """Attach the run's callbacks to ``trainer`` (a ``LoraSFTTrainer``) after those it already has, in this order,
    the chosen ones of them:

    1. SwanLab (with ``report_to`` swanlab): ours, in place of transformers' own;
    2. the guards and bookkeeping: the ``engine:`` line, divergence, data sources;
    3. answer accuracy, ahead of the memory tracer, which closes the eval phase its generation belongs to;
    4. memory and throughput, logged through ``Trainer.log`` so every ``report_to`` integration gets them;
    5. the checkpoint completion marker, after every callback whose ``on_save`` adds to a checkpoint;
    6. the run report, last: its ``on_train_end`` reads what the others logged.

    ``made``: what the trainer made for this run before it existed (the memory tracer that measured the model load,
    the accuracy callback), placed like the rest. A given callback that logs through the trainer is attached to it
    where it stands.
    """
    if "swanlab" in trainer.args.report_to:
        # transformers' own SwanLab callback crashes with swanlab 0.10 and needs an API key; ours runs offline.
        # Imported here: swanlab cost every process ~2 s to import on this project's CPU; most runs do not report to it.
        from hf_lora_ds.callbacks.swanlab import use_swanlab

        use_swanlab(trainer)
    given = list(trainer.callback_handler.callbacks)
    for callback in given:
        if isinstance(callback, LoggingCallback):
            callback.attach(trainer)  # metrics through Trainer.log (hf_lora_ds.callbacks.base); it stays in place
    for kind, make in _run_order(trainer):
        if any(isinstance(callback, kind) for callback in given):
            continue
        callback = next((cb for cb in made if isinstance(cb, kind)), None) or (make() if make else None)
        if isinstance(callback, LoggingCallback):
            callback.attach(trainer)
        elif callback is not None:
            trainer.add_callback(callback)


def _run_order(trainer: Trainer) -> list[tuple[type, Callable[[], Any] | None]]:
    """Each kind in the run's order, and how to make one where ``--run_callbacks`` chose it (None: not chosen, or
    only the one the trainer made: the accuracy callback needs the eval records)."""
    chosen = chosen_callbacks(trainer.args.run_callbacks)
    source_counts = getattr(trainer.train_dataset, "source_counts", None)
    makers: list[tuple[str | None, type, Callable[[], Any] | None]] = [
        ("engine", EngineCallback, lambda: EngineCallback(trainer)),
        ("divergence", DivergenceCallback, lambda: DivergenceCallback(trainer.args.on_divergence)),
        ("sources", SourceCountsLog, (lambda: SourceCountsLog(source_counts)) if source_counts else None),
        (None, AnswerAccuracyCallback, None),
        ("memory", MemoryTraceCallback, MemoryTraceCallback),
        ("throughput", ThroughputCallback, ThroughputCallback),
        (None, CheckpointCompletionCallback, CheckpointCompletionCallback),
        ("report", RunReportCallback, RunReportCallback),
    ]
    return [(kind, make if name is None or name in chosen else None) for name, kind, make in makers]
