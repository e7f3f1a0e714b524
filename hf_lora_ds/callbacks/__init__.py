"""Callbacks for any ``transformers.Trainer``: memory per phase and rank, throughput and MFU, SwanLab, run report.

None of them needs this package's trainer subclass::

    from hf_lora_ds.callbacks import MemoryTraceCallback, RunReportCallback, ThroughputCallback

    trainer = Trainer(model=model, args=args, train_dataset=train_dataset)
    MemoryTraceCallback().attach(trainer)
    ThroughputCallback().attach(trainer)
    trainer.add_callback(RunReportCallback())  # after the two above: it reads what they logged

``attach`` (rather than ``Trainer(callbacks=[...])``) lets the metrics reach every ``report_to`` integration.
With ``report_to="swanlab"``, call ``use_swanlab(trainer)``: it swaps transformers' SwanLab callback (which crashes
with swanlab 0.10) for one that also runs offline without an API key.
"""

from .accuracy import AnswerAccuracyCallback
from .memory import MemoryTraceCallback
from .run_report import RunReportCallback, write_run_report
from .swanlab import SwanLabCallback, default_swanlab_mode, use_swanlab
from .throughput import ThroughputCallback

__all__ = [
    "AnswerAccuracyCallback",
    "MemoryTraceCallback",
    "ThroughputCallback",
    "SwanLabCallback",
    "use_swanlab",
    "default_swanlab_mode",
    "RunReportCallback",
    "write_run_report",
]
