"""bench/gpu/step_timing.py: a step's phases add up to the step and land in the phase that spent the time; the
steady-state rates leave the warm-up steps out; the profiler summary counts launches, syncs and copies per step and
the device's busy time once where kernels overlap."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest
import torch

from tests.e2e.launching import REPO

sys.path.insert(0, str(REPO / "bench" / "gpu"))
from step_timing import (  # noqa: E402
    PHASES,
    ProfiledEvent,
    StepTimer,
    Windows,
    busy_seconds,
    profile_summary,
    steady_state,
    steps_from_marks,
)


def test_each_step_is_the_sum_of_its_marks_and_ends_where_the_next_starts():
    phases = ["callbacks", "data", "forward", "backward", "callbacks", "data", "forward", "backward", "callbacks"]
    seconds = [0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.5, 0.6]
    steps = steps_from_marks(phases, seconds, starts=[0, 4, 8])
    assert len(steps) == 2
    assert steps[0] == pytest.approx(
        {**dict.fromkeys(PHASES, 0.0), "callbacks": 0.1, "data": 0.2, "forward": 0.3, "backward": 0.4}
    )
    assert sum(steps[1].values()) == pytest.approx(0.1 + 0.2 + 0.5 + 0.6)


def test_steady_state_leaves_the_warmup_steps_out():
    one = {**dict.fromkeys(PHASES, 0.0), "forward": 0.03, "backward": 0.07}
    start_up = {**dict.fromkeys(PHASES, 0.0), "forward": 5.0}
    steps = [start_up, one, one, one]
    counts = {
        "warmup": {"real": 100, "supervised": 50},
        "timed": {"real": 600, "supervised": 300, "padded": 800, "sequences": 8},
    }
    figures = steady_state(steps, Windows(warmup=1, timed=3, profiled=0), counts)
    assert figures["step_ms"] == pytest.approx(100.0)
    assert figures["warmup_step_ms"] == pytest.approx(5000.0)
    assert figures["tokens_per_second"] == pytest.approx(600 / 0.3)
    assert figures["supervised_tokens_per_second"] == pytest.approx(300 / 0.3)
    assert figures["mean_row_tokens"] == pytest.approx(100)
    assert sum(figures["breakdown_ms"].values()) == pytest.approx(figures["step_ms"])


class _Counter:
    """Counts forwards; ``take`` returns what the throughput callback's counter would."""

    pad_token_id = None

    def __init__(self) -> None:
        self.forwards = 0

    def __call__(self, module, args, kwargs) -> None:
        self.forwards += 1

    def take(self, device) -> dict[str, int]:
        return {
            "real": 10 * self.forwards,
            "supervised": 4 * self.forwards,
            "padded": 12 * self.forwards,
            "sequences": self.forwards,
        }


def _fake_trainer(model: torch.nn.Module, backward_s: float) -> SimpleNamespace:
    """The parts of a Trainer the timer wraps; backward takes ``backward_s`` more than its own work."""

    def backward(loss: torch.Tensor, **kwargs) -> None:
        loss.backward()
        time.sleep(backward_s)

    return SimpleNamespace(
        callback_handler=SimpleNamespace(call_event=lambda event, args, state, control, **kwargs: control),
        accelerator=SimpleNamespace(backward=backward),
        _maybe_log_save_evaluate=lambda *args, **kwargs: None,
        model=model,
        processing_class=SimpleNamespace(pad_token_id=0),
    )


def _train(trainer: SimpleNamespace, steps: int, optimizer_s: float) -> None:
    """A Trainer's step loop, its optimizer step slowed by ``optimizer_s``."""
    handler = trainer.callback_handler
    for step in range(steps):
        state = SimpleNamespace(global_step=step)
        handler.call_event("on_step_begin", None, state, None)
        loss = trainer.model(torch.ones(2, 4)).sum()
        trainer.accelerator.backward(loss)
        handler.call_event("on_pre_optimizer_step", None, state, None)
        time.sleep(optimizer_s)
        handler.call_event("on_optimizer_step", None, state, None)
        handler.call_event("on_step_end", None, state, None)
        trainer._maybe_log_save_evaluate()


@pytest.mark.parametrize("slow_phase", ["optimizer", "backward"])
def test_the_timer_puts_the_time_where_it_was_spent_and_profiles_the_last_steps(slow_phase):
    windows = Windows(warmup=1, timed=3, profiled=2)
    profiles = []
    trainer = _fake_trainer(torch.nn.Linear(4, 4), backward_s=0.02 if slow_phase == "backward" else 0.0)
    timer = StepTimer(windows, _Counter, on_cuda=False, profile=lambda profiler, wall: profiles.append(wall))
    timer.attach(trainer)
    _train(trainer, windows.total, optimizer_s=0.02 if slow_phase == "optimizer" else 0.0)
    figures = timer.result(torch.device("cpu"))
    assert figures["timed_steps"] == 3 and len(figures["step_ms_each"]) == windows.total - 1
    breakdown = figures["breakdown_ms"]
    assert breakdown[slow_phase] >= 20 and breakdown[slow_phase] == max(breakdown.values()), breakdown
    assert sum(breakdown.values()) == pytest.approx(figures["step_ms"])
    assert figures["tokens"]["timed"]["real"] == 30 and figures["tokens"]["warmup"]["real"] == 10
    assert figures["supervised_tokens_per_second"] == pytest.approx(12 / (3 * figures["step_ms"] / 1000))
    assert len(profiles) == 1  # started at the first profiled step, stopped when the step after them began


def test_the_profile_summary_counts_per_step_and_overlapping_kernels_once():
    events = [
        ProfiledEvent("cudaLaunchKernel", False, 0, 1, self_cpu_us=1),
        ProfiledEvent("cudaLaunchKernel", False, 2, 3, self_cpu_us=1),
        ProfiledEvent("cudaStreamSynchronize", False, 10, 410, self_cpu_us=400),
        ProfiledEvent("aten::_local_scalar_dense", False, 5, 9, self_cpu_us=4),
        ProfiledEvent("gemm", True, 100, 300),
        ProfiledEvent("gemm", True, 200, 400),  # overlaps the first: busy 100-400 once
        ProfiledEvent("Memcpy DtoH (Device -> Pageable)", True, 400, 410),
    ]
    summary = profile_summary(events, steps=2, wall_s=0.001)
    assert summary["kernel_launches_per_step"] == 1 and summary["syncs_per_step"] == 0.5
    assert summary["sync_ms_per_step"] == pytest.approx(0.2) and summary["dtoh_copies_per_step"] == 0.5
    assert summary["scalar_reads_per_step"] == 0.5 and summary["kernels_per_step"] == 1
    assert summary["device_busy_fraction"] == pytest.approx(0.3)  # 300 us of the 1,000
    assert summary["top"][0] == {"name": "gemm", "ms_per_step": 0.2, "calls_per_step": 1.0}
    assert busy_seconds([(0, 10), (20, 30)]) == pytest.approx(20e-6)
    on_cpu = profile_summary(events[:4], steps=2, wall_s=0.001)
    assert on_cpu["device_busy_fraction"] is None and on_cpu["top"][0]["name"] == "cudaStreamSynchronize"
