"""``report.html``: one self-contained page per run (inline PNG plots, no network) from what the run logged."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2

from hf_lora_ds.model.lora_coverage import COVERAGE_FILE
from hf_lora_ds.report.argument_table import split_arguments
from hf_lora_ds.sizes import format_bytes

__all__ = ["write_report"]

_SUMMARY_KEYS = (
    "train_runtime",
    "train_loss",
    "train_samples_per_second",
    "total_flos",
    "throughput/flops_per_token",
    "throughput/peak_tflops_per_device",
    "engine",
    "kernels",
)
_MEMORY_KINDS = ("gpu", "gpu_reserved", "cpu")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
    return str(value)


def _eval_cell(value: Any, metric: str) -> str:
    """An eval_report.json value as the console's table shows it: sizes in MiB/GiB, reasons as ``name: count``."""
    if value is None:
        return ""
    if metric.endswith("_bytes") and isinstance(value, (int, float)):
        return format_bytes(value)
    if isinstance(value, dict):
        return ", ".join(f"{name}: {count}" for name, count in value.items()) or "-"
    return _fmt(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hf_lora_ds", "report"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["fmt"] = _fmt
    env.filters["eval_cell"] = _eval_cell
    return env


def _read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _run_summary(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """Run-level numbers, the latest value of each: Trainer's summary, ``throughput/run_*``, the samples per
    data source (``data/samples/*``) and the engine and kernels the run used (hf_lora_ds.callbacks.engine_line)."""
    summary: dict[str, Any] = {}
    for entry in log_history:
        for key, value in entry.items():
            if key in _SUMMARY_KEYS or key.startswith(("throughput/run_", "data/samples/")):
                summary[key] = value
    return summary


def write_report(
    output_dir: str | Path,
    log_history: list[dict[str, Any]],
    *,
    memory_records: list[dict[str, Any]] | None = None,
    eval_report: dict[str, Any] | str | Path | None = None,
    arguments: dict[str, Any] | None = None,
    argument_defaults: dict[str, Any] | None = None,
    deepspeed_config: dict[str, Any] | None = None,
    title: str = "LoRA SFT run report",
) -> Path:
    """Render ``<output_dir>/report.html`` and return its path.

    ``memory_records`` defaults to ``<output_dir>/memory_trace.json`` (written by MemoryTraceCallback) and
    ``eval_report`` to ``<output_dir>/eval_report.json`` (``{"before": {"accuracy": ...}, "after": {...}}``); a
    path to such a file works too. Sections whose data is missing say so instead of failing.

    With ``argument_defaults`` (``hf_lora_ds.report.argument_table.declared_defaults``) the arguments that differ from
    them come first, the rest folded under a ``<details>``; without, all are listed.
    """
    from hf_lora_ds.report import plots  # matplotlib takes ~0.5 s to import; only writing a report needs it

    output_dir = Path(output_dir)
    if memory_records is None:
        memory_records = _load_json(output_dir / "memory_trace.json") or []
    if eval_report is None:
        eval_report = output_dir / "eval_report.json"
    if isinstance(eval_report, (str, Path)):
        eval_report = _load_json(Path(eval_report))
    eval_sides = [side for side in ("before", "after") if eval_report and isinstance(eval_report.get(side), dict)]
    eval_metrics = sorted({metric for side in eval_sides for metric in eval_report[side]})
    steps = [entry["step"] for entry in log_history if "step" in entry]
    final_step = max(steps) if steps else None
    changed_arguments, other_arguments = None, dict(sorted((arguments or {}).items()))
    if arguments and argument_defaults is not None:
        changed_arguments, other_arguments = split_arguments(arguments, argument_defaults)
    html = (
        _environment()
        .get_template("template.html")
        .render(
            title=title,
            written_at=datetime.now().isoformat(timespec="seconds"),
            output_dir=str(output_dir),
            final_step=final_step,
            eval_report=eval_report if eval_sides else None,
            eval_sides=eval_sides,
            eval_metrics=eval_metrics,
            memory_records=memory_records,
            memory_kinds=_MEMORY_KINDS,
            run_summary=_run_summary(log_history),
            changed_arguments=changed_arguments,
            other_arguments=other_arguments,
            deepspeed_config=deepspeed_config,
            lora_coverage=_read_text(output_dir / COVERAGE_FILE),  # written by LoraSFTTrainer.train
            plots={
                "loss": plots.loss_plot(log_history),
                "accuracy_curve": plots.accuracy_curve_plot(log_history, eval_report, final_step),
                "memory": plots.memory_plot(memory_records),
                "throughput": plots.throughput_plot(log_history),
                "accuracy": plots.accuracy_plot(eval_report) if eval_sides else None,
            },
        )
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "report.html"
    path.write_text(html, encoding="utf-8")
    return path
