"""Every TrainerCallback of the package: metric callbacks that work in any ``transformers.Trainer`` (memory, throughput
and MFU, answer accuracy, SwanLab, the run report) and the guards and bookkeeping of a LoRA SFT run.

``LoraSFTTrainer`` attaches the ones its run chooses, in order, after those it was given. With a plain Trainer, attach
the metric ones yourself (``attach`` lets them reach every ``report_to`` integration; with ``report_to="swanlab"`` call
``use_swanlab(trainer)``)::

    MemoryTraceCallback().attach(trainer)
    ThroughputCallback().attach(trainer)
    trainer.add_callback(RunReportCallback())  # after the two above: it reads what they logged
"""

from hf_lora_ds.callbacks.accuracy import AnswerAccuracyCallback, log_accuracy_end_points
from hf_lora_ds.callbacks.checkpoint_completion import CheckpointCompletionCallback
from hf_lora_ds.callbacks.data_sources import SourceCountsLog
from hf_lora_ds.callbacks.divergence import DivergenceCallback
from hf_lora_ds.callbacks.engine_line import EngineCallback
from hf_lora_ds.callbacks.memory import MemoryTraceCallback
from hf_lora_ds.callbacks.progress_bar import bar_after_setup_lines
from hf_lora_ds.callbacks.run_callbacks import attach_run_callbacks
from hf_lora_ds.callbacks.run_report import RunReportCallback, write_run_report
from hf_lora_ds.callbacks.throughput import ThroughputCallback

__all__ = [
    "AnswerAccuracyCallback",
    "log_accuracy_end_points",
    "MemoryTraceCallback",
    "ThroughputCallback",
    "SwanLabCallback",
    "use_swanlab",
    "default_swanlab_mode",
    "RunReportCallback",
    "write_run_report",
    "CheckpointCompletionCallback",
    "DivergenceCallback",
    "EngineCallback",
    "SourceCountsLog",
    "attach_run_callbacks",
    "bar_after_setup_lines",
]

_SWANLAB_NAMES = ("SwanLabCallback", "default_swanlab_mode", "use_swanlab")


def __getattr__(name: str):
    """The SwanLab names, imported on first use: importing swanlab cost every process ~2 s here (its rich, pydantic and
    pyecharts stack), and a run imports it only when ``report_to`` names it."""
    if name in _SWANLAB_NAMES:
        from hf_lora_ds.callbacks import swanlab

        return getattr(swanlab, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
