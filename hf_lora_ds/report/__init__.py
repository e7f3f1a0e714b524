"""``report.html`` for a run: loss, memory per phase and rank, throughput, accuracy, arguments, DeepSpeed config.

``hf_lora_ds.callbacks.RunReportCallback`` writes it when training ends; ``write_report`` writes it any time.
"""

from hf_lora_ds.report.render import write_report

__all__ = ["write_report"]
