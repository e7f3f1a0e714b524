"""The report's plots, as base64 PNG strings ready for ``<img src="data:image/png;base64,...">``.

Figures are built with ``matplotlib.figure.Figure`` and rendered by the Agg canvas directly, never through
``pyplot``: no display is needed, and the user's global backend (a notebook's, say) is left untouched.
Each function returns None when the run logged nothing to plot. A run writes its report twice (when training ends,
then with the eval's accuracy): the loss and throughput plots, whose series do not change between the two, are drawn
once.
"""

from __future__ import annotations

import base64
import functools
import io
import json
from collections.abc import Callable
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["loss_plot", "memory_plot", "throughput_plot", "accuracy_plot", "accuracy_curve_plot"]

_MEMORY_KINDS = (("gpu", "GPU allocated"), ("gpu_reserved", "GPU reserved"), ("cpu", "host RSS"))
_ACCURACY_COLORS = {"before": "#999999", "after": "#2a7ab0"}  # the base model grey, the tuned one blue, as in the bars
_LAST_DRAWN: dict[str, tuple[str, str]] = {}  # plot name -> (its data as JSON, the PNG drawn from it)


def _drawn_once_per_data(plot: Callable[..., str]) -> Callable[..., str]:
    """``plot``, returning its last PNG again while its arguments are the same data (drawing is the slow part)."""

    @functools.wraps(plot)
    def drawn(*data: Any) -> str:
        key = json.dumps(data, default=repr)
        last = _LAST_DRAWN.get(plot.__name__)
        if last is None or last[0] != key:
            last = _LAST_DRAWN[plot.__name__] = (key, plot(*data))
        return last[1]

    return drawn


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _series(log_history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [(entry["step"], entry[key]) for entry in log_history if key in entry and "step" in entry]
    return [p[0] for p in points], [p[1] for p in points]


def loss_plot(log_history: list[dict[str, Any]]) -> str | None:
    """Training loss per logging step, with the evaluation loss when there is one."""
    curves = [(label, *_series(log_history, key)) for key, label in (("loss", "train"), ("eval_loss", "eval"))]
    curves = [c for c in curves if c[1]]
    return _loss_png(curves) if curves else None


@_drawn_once_per_data
def _loss_png(curves: list[tuple[str, list[float], list[float]]]) -> str:
    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    for label, steps, values in curves:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
    ax.set(xlabel="step", ylabel="loss", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def _phase_label(record: dict[str, Any]) -> str:
    return record["phase"] if record["phase"] in ("load", "train") else f"{record['phase']}@{record['step']}"


def memory_plot(records: list[dict[str, Any]]) -> str | None:
    """Per phase, one stacked bar per rank: memory at the start (pale) plus the peak above it; a panel per kind."""
    kinds = [(k, label) for k, label in _MEMORY_KINDS if records and k in records[0]["ranks"][0]]
    if not kinds:
        return None
    labels = [_phase_label(r) for r in records]
    n_ranks = max(len(r["ranks"]) for r in records)
    width = 0.8 / n_ranks
    fig = Figure(figsize=(max(6, 0.9 * len(records)), 3 * len(kinds)))
    for row, (kind, kind_label) in enumerate(kinds, start=1):
        ax = fig.add_subplot(len(kinds), 1, row)
        for rank in range(n_ranks):
            stats = [r["ranks"][rank][kind] if rank < len(r["ranks"]) else None for r in records]
            x = [i + rank * width for i in range(len(records))]
            before = [s["before"] if s else 0 for s in stats]
            color = f"C{rank % 10}"
            ax.bar(x, before, width, color=color, alpha=0.3)
            ax.bar(x, [s["peak"] if s else 0 for s in stats], width, bottom=before, color=color, label=f"rank {rank}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(records))], labels)
        ax.set(ylabel="MiB", title=f"{kind_label}: at phase start (pale) + peak above it (max - begin)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _png(fig)


def throughput_plot(log_history: list[dict[str, Any]]) -> str | None:
    """Tokens/s per logging window (all and supervised), with padding efficiency and MFU beside them."""
    rates = [
        (label, *_series(log_history, f"throughput/{key}"))
        for key, label in (("tokens_per_second", "all tokens/s"), ("supervised_tokens_per_second", "supervised/s"))
    ]
    rates = [r for r in rates if r[1]]
    fractions = [
        (label, *_series(log_history, f"throughput/{key}"))
        for key, label in (("padding_efficiency", "padding efficiency"), ("mfu", "MFU"))
    ]
    return _throughput_png(rates, [f for f in fractions if f[1]]) if rates else None


@_drawn_once_per_data
def _throughput_png(
    rates: list[tuple[str, list[float], list[float]]], fractions: list[tuple[str, list[float], list[float]]]
) -> str:
    fig = Figure(figsize=(10, 3.5))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for label, steps, values in rates:
        left.plot(steps, values, marker="o", label=label)
    left.set(xlabel="step", ylabel="tokens / s (all ranks)", title="Throughput per logging window")
    left.legend()
    for label, steps, values in fractions:
        right.plot(steps, values, marker="o", label=label)
    right.set(xlabel="step", ylabel="fraction", title="Padding efficiency and MFU", ylim=(0, 1.05))
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def accuracy_plot(eval_report: dict[str, Any]) -> str | None:
    """Accuracy before and after fine-tuning, from ``{"before": {"accuracy": a}, "after": {"accuracy": b}}``."""
    values = [(k, (eval_report.get(k) or {}).get("accuracy")) for k in ("before", "after")]
    bars = [(k, v) for k, v in values if isinstance(v, (int, float))]
    if not bars:
        return None
    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=[_ACCURACY_COLORS[b[0]] for b in bars])
    for i, (_, value) in enumerate(bars):
        ax.annotate(f"{value:.3f}", (i, value), ha="center", va="bottom")
    ax.set(ylabel="accuracy", ylim=(0, 1.15 * max(1.0, *(b[1] for b in bars))), title="Accuracy before / after")
    return _png(fig)


def _accuracy_of(eval_report: dict[str, Any] | None, side: str) -> float | None:
    accuracy = ((eval_report or {}).get(side) or {}).get("accuracy")
    return accuracy if isinstance(accuracy, (int, float)) else None


def accuracy_curve_plot(
    log_history: list[dict[str, Any]], eval_report: dict[str, Any] | None, final_step: int | None
) -> str | None:
    """Answer accuracy against step: the evaluations during training (``eval_accuracy``), from the base model's
    accuracy at step 0 to the tuned one's at ``final_step`` (``eval_report``'s before and after). None when the run
    did not evaluate during training: then the before/after bars say everything."""
    steps, values = _series(log_history, "eval_accuracy")
    if not steps:
        return None
    ends = [(side, step, _accuracy_of(eval_report, side)) for side, step in (("before", 0), ("after", final_step))]
    ends = [(side, step, value) for side, step, value in ends if step is not None and value is not None]
    line = sorted({**dict(zip(steps, values)), **{step: value for _, step, value in ends}}.items())
    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    ax.plot([step for step, _ in line], [value for _, value in line], color=_ACCURACY_COLORS["after"], alpha=0.4)
    ax.plot(steps, values, "o", color=_ACCURACY_COLORS["after"], label="during training")
    for side, step, value in ends:
        ax.plot([step], [value], "s", markersize=8, color=_ACCURACY_COLORS[side], label=side)
        ax.annotate(f"{value:.3f}", (step, value), textcoords="offset points", xytext=(0, 7), ha="center")
    ax.set(xlabel="step", ylabel="accuracy", ylim=(-0.03, 1.12), title="Accuracy during training")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return _png(fig)
