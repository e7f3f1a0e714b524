"""Where a training step goes: phase marks on the device's timeline, steady-state rates, a profiler summary.

``StepTimer.attach(trainer)`` puts a mark at every boundary of a ``transformers.Trainer`` step: around each callback
dispatch, before the model's forward, around ``accelerator.backward`` and around the trainer's log/save/evaluate. On
CUDA a mark is a recorded ``torch.cuda.Event``, so the time between two marks is the time the GPU's stream took from
one to the next: where the host is the bottleneck the stream idles between them and that shows; nothing synchronizes
until the run ends. On the CPU ops run synchronously and a mark is ``time.perf_counter()``. The time from one mark to
the next belongs to the phase the first one opened, so a step's phases add up to the step exactly.

Steps run in three windows: the first ``warmup`` (CUDA/cuBLAS start-up, allocator growth) are left out, the next
``timed`` give the steady-state rates and breakdown, the last ``profiled`` run under ``torch.profiler`` (which slows
them) for the summary. One step more follows, whose start closes the profiled window.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "PHASES",
    "Windows",
    "StepTimer",
    "ProfiledEvent",
    "steps_from_marks",
    "steady_state",
    "profile_summary",
    "profiled_events",
    "busy_seconds",
]

# data: fetching and collating the batch, copying it to the device; forward: the model's forward and the loss;
# backward: accelerator.backward; optimizer: between the pre- and post-optimizer-step callbacks; callbacks: every
# callback dispatch; log_save: the trainer's log/save/evaluate (its loss read is a device-to-host sync); other: the
# rest (gradient clipping, scheduler, zero_grad, the trainer's bookkeeping).
PHASES = ("data", "forward", "backward", "optimizer", "callbacks", "log_save", "other")
# The phase that resumes after a callback dispatch; an event not named here resumes the phase it interrupted.
_AFTER_EVENT = {"on_step_begin": "data", "on_pre_optimizer_step": "optimizer", "on_optimizer_step": "other"}
_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


@dataclass(frozen=True)
class Windows:
    """How many steps each window holds; the run needs ``total`` steps."""

    warmup: int
    timed: int
    profiled: int

    @property
    def total(self) -> int:
        return self.warmup + self.timed + self.profiled + 1  # the last step's start ends the profiled window

    def of(self, step: int) -> str:
        if step < self.warmup:
            return "warmup"
        return "timed" if step < self.warmup + self.timed else "profiled"


class _HostClock:
    """CPU ops finish before they return: the host's clock is the compute's."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def settle(self) -> None:
        pass


class _CudaClock:
    """Events on the current stream: the marks cost no synchronization until ``settle``."""

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000

    def settle(self) -> None:
        torch.cuda.synchronize()


def steps_from_marks(phases: Sequence[str], seconds: Sequence[float], starts: Sequence[int]) -> list[dict[str, float]]:
    """Each step's seconds per phase. ``phases[i]`` is what mark ``i`` opened, ``seconds[i]`` the time from mark ``i``
    to mark ``i + 1``, ``starts[k]`` the index of step ``k``'s first mark; a step ends where the next one starts, so
    the last start only closes the step before it."""
    steps = []
    for begin, end in zip(starts, starts[1:]):
        totals = dict.fromkeys(PHASES, 0.0)
        for index in range(begin, end):
            totals[phases[index]] += seconds[index]
        steps.append(totals)
    return steps


def steady_state(steps: Sequence[dict[str, float]], windows: Windows, counts: dict[str, dict[str, int]]) -> dict:
    """Rates over the timed window only (``counts[window]``: tokens seen in each window), the mean step's breakdown
    in milliseconds, and the warm-up steps' mean for comparison."""
    timed = steps[windows.warmup : windows.warmup + windows.timed]
    warmup = steps[: windows.warmup]
    seconds = sum(sum(step.values()) for step in timed)
    tokens = counts.get("timed", {})
    figures: dict[str, Any] = {
        "timed_steps": len(timed),
        "step_ms": 1000 * seconds / len(timed) if timed else None,
        "warmup_step_ms": 1000 * sum(sum(s.values()) for s in warmup) / len(warmup) if warmup else None,
        "breakdown_ms": {phase: 1000 * sum(s[phase] for s in timed) / len(timed) for phase in PHASES} if timed else {},
    }
    if seconds > 0:
        figures["tokens_per_second"] = tokens.get("real", 0) / seconds
        figures["supervised_tokens_per_second"] = tokens.get("supervised", 0) / seconds
        figures["padded_tokens_per_second"] = tokens.get("padded", 0) / seconds
        figures["mean_row_tokens"] = tokens.get("padded", 0) / max(tokens.get("sequences", 0), 1)
    return figures


class StepTimer:
    """Marks a Trainer's steps (see the module's docstring); ``counter_factory`` makes one token counter per window
    (a forward pre-hook with ``take(device)``: the throughput callback's), ``profile`` is called with the profiled
    window's ``torch.profiler.profile`` once it stops."""

    def __init__(
        self,
        windows: Windows,
        counter_factory: Callable[[], Any],
        on_cuda: bool,
        profile: Callable[[Any, float], None] | None = None,
    ) -> None:
        self.windows = windows
        self.on_cuda = on_cuda
        self._clock = _CudaClock() if on_cuda else _HostClock()
        self._marks: list[tuple[str, Any]] = []
        self._starts: list[int] = []
        self._resume = "data"
        self._counters = {name: counter_factory() for name in ("warmup", "timed", "profiled")}
        self._window = "warmup"
        self._profile = profile
        self._profiler: Any = None
        self._profiler_started = 0.0

    def _mark(self, phase: str) -> None:
        self._marks.append((phase, self._clock.mark()))
        if phase != "callbacks":
            self._resume = phase

    def attach(self, trainer: Any) -> StepTimer:
        """Wraps the trainer's callback dispatch, backward and log/save (on this instance only) and hooks its model."""
        handler = trainer.callback_handler
        dispatch, backward = handler.call_event, trainer.accelerator.backward
        log_save = trainer._maybe_log_save_evaluate  # private in transformers, stable from 4.3x to 5.x

        def call_event(event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if event == "on_step_begin":
                self._begin_step(state.global_step)
            else:
                self._mark("callbacks")
            result = dispatch(event, args, state, control, **kwargs)
            self._mark(_AFTER_EVENT.get(event, self._resume))
            return result

        def timed_backward(loss: torch.Tensor, **kwargs: Any) -> Any:
            self._mark("backward")
            result = backward(loss, **kwargs)
            self._mark("other")
            return result

        def timed_log_save(*args: Any, **kwargs: Any) -> Any:
            self._mark("log_save")
            result = log_save(*args, **kwargs)
            self._mark("data")  # the loop fetches the next batch next
            return result

        handler.call_event = call_event
        trainer.accelerator.backward = timed_backward
        trainer._maybe_log_save_evaluate = timed_log_save
        pad = getattr(getattr(trainer, "processing_class", None), "pad_token_id", None)
        for counter in self._counters.values():
            counter.pad_token_id = pad
            counter.trainer = trainer  # the package's loss passes no labels to the forward: it says what it trains
        trainer.model.register_forward_pre_hook(self._forward, with_kwargs=True)
        return self

    def _forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if module.training:
            self._mark("forward")
            self._counters[self._window](module, args, kwargs)

    def _begin_step(self, step: int) -> None:
        self._starts.append(len(self._marks))
        self._mark("callbacks")
        self._window = self.windows.of(step)
        first_profiled = self.windows.warmup + self.windows.timed
        if step == first_profiled and self._profile is not None:
            self._start_profiler()
        elif step == first_profiled + self.windows.profiled and self._profiler is not None:
            self._clock.settle()  # the window's device work inside the trace, and its wall time
            self._profiler.stop()
            self._profile(self._profiler, time.perf_counter() - self._profiler_started)
            self._profiler = None

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
        self._profiler = profile(activities=activities)
        self._clock.settle()  # no earlier work in the window's wall time
        self._profiler.start()
        self._profiler_started = time.perf_counter()

    def result(self, device: torch.device) -> dict:
        """The steps' breakdown and the steady-state rates; reads the device once (call after training)."""
        self._clock.settle()
        marks = self._marks
        seconds = [self._clock.seconds(a[1], b[1]) for a, b in zip(marks, marks[1:])]
        steps = steps_from_marks([phase for phase, _ in marks], seconds, self._starts)
        counts = {name: counter.take(device) for name, counter in self._counters.items()}
        figures = steady_state(steps, self.windows, counts)
        figures["step_ms_each"] = [round(1000 * sum(step.values()), 2) for step in steps]
        figures["tokens"] = counts
        return figures


@dataclass(frozen=True)
class ProfiledEvent:
    """What the summary reads of one profiler event: its name, whether it ran on the device, its interval (us) and
    the host time it took itself."""

    name: str
    on_device: bool
    start_us: float
    end_us: float
    self_cpu_us: float = 0.0


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start_us, end_us)`` intervals, in seconds: concurrent kernels count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def profile_summary(events: Sequence[ProfiledEvent], steps: int, wall_s: float, top: int = 10) -> dict:
    """Per step: host wall and op time, kernel launches, device-to-host syncs and copies, scalar reads (``item``,
    ``bool``: ``aten::_local_scalar_dense``, a sync on CUDA) and ``nonzero`` calls; the device's busy fraction of the
    wall time; the top kernels (on the CPU: the top ops by their own time)."""
    names = Counter(event.name for event in events)
    device = [event for event in events if event.on_device]
    kernels = [event for event in device if not event.name.startswith("Memcpy") and not event.name.startswith("Memset")]
    spent: Counter[str] = Counter()
    for event in kernels or [event for event in events if not event.on_device]:
        spent[event.name] += (event.end_us - event.start_us) if event.on_device else event.self_cpu_us
    sync_us = sum(event.end_us - event.start_us for event in events if event.name in _SYNCS)
    return {
        "steps": steps,
        "wall_ms_per_step": 1000 * wall_s / steps,
        "cpu_op_ms_per_step": sum(e.self_cpu_us for e in events if not e.on_device) / 1000 / steps,
        "kernels_per_step": len(kernels) / steps,
        "kernel_launches_per_step": sum(names[name] for name in _LAUNCHES) / steps,
        "syncs_per_step": sum(names[name] for name in _SYNCS) / steps,
        "sync_ms_per_step": sync_us / 1000 / steps,
        "dtoh_copies_per_step": sum(1 for e in device if e.name.startswith("Memcpy DtoH")) / steps,
        "scalar_reads_per_step": names["aten::_local_scalar_dense"] / steps,
        "nonzero_per_step": names["aten::nonzero"] / steps,
        "device_busy_fraction": busy_seconds((e.start_us, e.end_us) for e in kernels) / wall_s if device else None,
        "top": [
            {"name": name[:120], "ms_per_step": round(us / 1000 / steps, 3), "calls_per_step": names[name] / steps}
            for name, us in spent.most_common(top)
        ],
    }


def profiled_events(profiler: Any) -> list[ProfiledEvent]:
    """The profiler's events in the summary's terms. A ``record_function`` range projected onto the device's timeline
    (a user annotation) is no kernel: it would cover the whole range in the busy time."""
    from torch.autograd import DeviceType

    return [
        ProfiledEvent(
            name=event.name,
            on_device=event.device_type != DeviceType.CPU,
            start_us=event.time_range.start,
            end_us=event.time_range.end,
            self_cpu_us=event.self_cpu_time_total if event.device_type == DeviceType.CPU else 0.0,
        )
        for event in profiler.events()
        if not (event.device_type != DeviceType.CPU and getattr(event, "is_user_annotation", False))
    ]
