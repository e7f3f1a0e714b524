"""hf_lora_ds.report.plots: each plot draws what the run logged, skips what it did not, and comes out a PNG."""

from __future__ import annotations

import base64
import copy

import pytest

from hf_lora_ds.report import plots

HISTORY = [
    {"step": 1, "loss": 2.0, "throughput/tokens_per_second": 100.0, "throughput/mfu": 0.2},
    {
        "step": 2,
        "loss": 1.5,
        "eval_loss": 1.7,
        "throughput/tokens_per_second": 120.0,
        "throughput/mfu": 0.25,
        "throughput/supervised_tokens_per_second": 40.0,
    },
    {"step": 3, "loss": 1.0, "throughput/tokens_per_second": 130.0},
    {"train_runtime": 12.0},  # Trainer's last entry: no step, nothing to plot
]


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The figures the plots render, kept for inspection instead of only their PNG bytes; none drawn before counts."""
    figures = []
    monkeypatch.setattr(plots, "_LAST_DRAWN", {})
    render = plots._png

    def keep(fig):
        figures.append(fig)
        return render(fig)

    monkeypatch.setattr(plots, "_png", keep)
    return figures


def _lines(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_a_plot_is_a_base64_png():
    png = base64.b64decode(plots.loss_plot(HISTORY))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_a_plot_is_drawn_again_only_when_its_data_changed(drawn):
    first = plots.loss_plot(HISTORY)
    assert plots.loss_plot(copy.deepcopy(HISTORY)) == first and len(drawn) == 1  # the same data: the same PNG
    assert plots.throughput_plot(HISTORY) and len(drawn) == 2  # each plot has its own
    assert plots.loss_plot(HISTORY[:2]) != first and len(drawn) == 3
    assert plots.loss_plot(HISTORY) == first and len(drawn) == 4  # only the last data is kept


def test_loss_plot_draws_train_and_eval_loss_at_their_steps(drawn):
    plots.loss_plot(HISTORY)
    (ax,) = drawn[0].axes
    assert _lines(ax) == {"train": ([1, 2, 3], [2.0, 1.5, 1.0]), "eval": ([2], [1.7])}


def test_throughput_plot_draws_rates_left_and_fractions_right(drawn):
    plots.throughput_plot(HISTORY)
    left, right = drawn[0].axes
    assert _lines(left) == {"all tokens/s": ([1, 2, 3], [100.0, 120.0, 130.0]), "supervised/s": ([2], [40.0])}
    assert _lines(right) == {"MFU": ([1, 2], [0.2, 0.25])}


def test_accuracy_plot_draws_the_phases_that_have_an_accuracy(drawn):
    plots.accuracy_plot({"before": {"accuracy": 0.1}, "after": {"accuracy": 0.9}})
    (ax,) = drawn[0].axes
    assert [patch.get_height() for patch in ax.patches] == [0.1, 0.9]
    plots.accuracy_plot({"before": None, "after": {"accuracy": 0.5}})
    assert [patch.get_height() for patch in drawn[1].axes[0].patches] == [0.5]


def test_accuracy_curve_runs_from_before_at_step_0_to_after_at_the_last_step(drawn):
    history = [*HISTORY, {"step": 2, "eval_accuracy": 0.4}, {"step": 3, "eval_accuracy": 0.8}]
    plots.accuracy_curve_plot(history, {"before": {"accuracy": 0.1}, "after": {"accuracy": 0.9}}, final_step=4)
    (ax,) = drawn[0].axes
    lines = _lines(ax)
    assert lines["during training"] == ([2, 3], [0.4, 0.8])
    assert lines["before"] == ([0], [0.1]) and lines["after"] == ([4], [0.9])
    (curve,) = [line for line in ax.get_lines() if line.get_label().startswith("_")]  # the unlabelled line
    assert (list(curve.get_xdata()), list(curve.get_ydata())) == ([0, 2, 3, 4], [0.1, 0.4, 0.8, 0.9])
    assert ax.get_title() == "Accuracy during training"


def test_accuracy_curve_without_an_eval_report_draws_the_evaluations_alone(drawn):
    plots.accuracy_curve_plot([{"step": 5, "eval_accuracy": 0.5}], None, final_step=10)
    labelled = {label for label in _lines(drawn[0].axes[0]) if not label.startswith("_")}
    assert labelled == {"during training"}


def test_memory_plot_stacks_the_peak_above_the_start_per_rank(drawn):
    def stats(before, peak):
        return {"cpu": {"before": before, "peak": peak}}

    records = [
        {"phase": "load", "step": 0, "ranks": [stats(100, 50), stats(110, 40)]},
        {"phase": "eval", "step": 4, "ranks": [stats(200, 20), stats(210, 30)]},
    ]
    plots.memory_plot(records)
    (ax,) = drawn[0].axes  # one panel: only host memory was recorded
    heights = [patch.get_height() for patch in ax.patches]
    assert heights == [100, 200, 50, 20, 110, 210, 40, 30]  # per rank: starts (pale), then peaks above them
    assert [patch.get_y() for patch in ax.patches] == [0, 0, 100, 200, 0, 0, 110, 210]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["load", "eval@4"]


@pytest.mark.parametrize(
    ("plot", "nothing"),
    [
        (plots.loss_plot, [{"train_runtime": 1.0}]),
        (plots.throughput_plot, [{"step": 1, "loss": 1.0}]),
        (plots.accuracy_plot, {"before": {"accuracy": None}}),
        (plots.memory_plot, []),
        (lambda history: plots.accuracy_curve_plot(history, {"after": {"accuracy": 1.0}}, 3), HISTORY),
    ],
)
def test_nothing_logged_is_no_plot(plot, nothing):
    assert plot(nothing) is None
