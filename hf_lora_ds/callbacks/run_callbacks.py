"""Every callback of a LoRA SFT run, attached to its trainer in the order they must run.

Some callbacks read what others did in the same event, so the order of ``trainer.callback_handler.callbacks`` is part
of what they mean (``attach_run_callbacks`` says why each goes where). The run's own callbacks are the ones
``--run_callbacks`` names (the command line's default: all; a trainer built in code: what its arguments name, so no
signal handler unless asked); the learning-rate watch and the checkpoint completion marker always go, the trainer's
own checks read them. A callback of one of these kinds passed in ``callbacks=[...]`` is the one used, moved to its
place: that is how the trainer hands over the memory tracer that has already measured the model load, and the
accuracy callback (attached only when given: it needs the eval records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import Trainer
from transformers.trainer_callback import ProgressCallback

from hf_lora_ds.callbacks.accuracy import AnswerAccuracyCallback
from hf_lora_ds.callbacks.checkpoint_completion import CheckpointCompletionCallback
from hf_lora_ds.callbacks.data_sources import SourceCountsLog
from hf_lora_ds.callbacks.divergence import DivergenceCallback
from hf_lora_ds.callbacks.engine_line import EngineCallback
from hf_lora_ds.callbacks.learning_rate import LearningRateWatch
from hf_lora_ds.callbacks.memory import MemoryTraceCallback
from hf_lora_ds.callbacks.preemption import PreemptionCallback
from hf_lora_ds.callbacks.progress_bar import SetupFirstProgressCallback
from hf_lora_ds.callbacks.run_report import RunReportCallback
from hf_lora_ds.callbacks.throughput import ThroughputCallback
from hf_lora_ds.config.reporting import chosen_callbacks

__all__ = ["RunCallbacks", "attach_run_callbacks"]


@dataclass
class RunCallbacks:
    """The attached callbacks the trainer itself asks things of (None: not chosen by --run_callbacks)."""

    learning_rates: LearningRateWatch
    preemption: PreemptionCallback | None
    memory: MemoryTraceCallback | None


def attach_run_callbacks(trainer: Trainer) -> RunCallbacks:
    """Attach the run's callbacks to ``trainer`` (a ``LoraSFTTrainer``) in this order, the chosen ones of them:

    0. the progress bar, shown only from the first epoch on, after the setup lines printed at train begin;
    1. SwanLab (with ``report_to`` swanlab): ours, in place of transformers' own;
    2. the guards and bookkeeping: highest learning rate, preemption, the ``engine:`` line, divergence, data sources;
    3. answer accuracy, ahead of the memory tracer, which closes the eval phase its generation belongs to;
    4. memory and throughput, logged through ``Trainer.log`` so every ``report_to`` integration gets them;
    5. the checkpoint completion marker, after every callback whose ``on_save`` adds to a checkpoint;
    6. the run report, last: its ``on_train_end`` reads what the others logged.
    """
    _start_the_bar_after_the_setup_lines(trainer)
    if "swanlab" in trainer.args.report_to:
        # transformers' own SwanLab callback crashes with swanlab 0.10 and needs an API key; ours runs offline.
        # Imported here: swanlab cost every process ~2 s to import on this project's CPU; most runs do not report to it.
        from hf_lora_ds.callbacks.swanlab import use_swanlab

        use_swanlab(trainer)
    chosen = chosen_callbacks(trainer.args.run_callbacks)
    source_counts = getattr(trainer.train_dataset, "source_counts", None)
    # Each kind: its --run_callbacks name (None: always), and how to make one if none was given (a given one is used).
    run_order: list[tuple[str | None, type, Callable[[], Any] | None]] = [
        (None, LearningRateWatch, LearningRateWatch),
        ("preemption", PreemptionCallback, PreemptionCallback),
        ("engine", EngineCallback, lambda: EngineCallback(trainer)),
        ("divergence", DivergenceCallback, lambda: DivergenceCallback(trainer.args.on_divergence)),
        ("sources", SourceCountsLog, (lambda: SourceCountsLog(source_counts)) if source_counts else None),
        (None, AnswerAccuracyCallback, None),  # it needs the eval records: only the one given
        ("memory", MemoryTraceCallback, MemoryTraceCallback),
        ("throughput", ThroughputCallback, ThroughputCallback),
        (None, CheckpointCompletionCallback, CheckpointCompletionCallback),
        ("report", RunReportCallback, RunReportCallback),
    ]
    handler = trainer.callback_handler.callbacks
    given = [cb for cb in handler if isinstance(cb, tuple(kind for _, kind, _ in run_order))]
    for callback in given:  # taken out, then put back in the run's order
        handler.remove(callback)
    attached = {}
    for name, kind, make in run_order:
        wanted = make is not None and (name is None or name in chosen)
        callback = next((cb for cb in given if isinstance(cb, kind)), None) or (make() if wanted else None)
        if callback is None:
            continue
        if hasattr(callback, "attach"):
            callback.attach(trainer)  # metrics through Trainer.log (hf_lora_ds.callbacks.base)
        else:
            trainer.add_callback(callback)
        attached[kind] = callback
    return RunCallbacks(
        learning_rates=attached[LearningRateWatch],
        preemption=attached.get(PreemptionCallback),
        memory=attached.get(MemoryTraceCallback),
    )


def _start_the_bar_after_the_setup_lines(trainer: Trainer) -> None:
    handler = trainer.callback_handler.callbacks
    for index, callback in enumerate(handler):
        if type(callback) is ProgressCallback:  # the terminal's: a notebook's bar and --disable_tqdm's printer stay
            handler[index] = SetupFirstProgressCallback(callback.max_str_len)
