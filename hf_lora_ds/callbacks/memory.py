"""Memory per phase and per rank: accelerator memory and host RAM, before / consumed / peak / total peak.

Users move between ZeRO stages and offload to fit a model, and what they trade is GPU memory against host RAM on
every rank. Trainer's own tracker (``skip_memory_metrics=False``) reports one rank and skips the evaluations and
saves inside training; PEFT's DeepSpeed examples print the numbers people know (``TorchTracemalloc``) but only
around a hand-written loop. This callback
measures the same four numbers for each phase of a plain ``Trainer`` run, on every rank, and logs the min and max
across ranks (``memory/<phase>/<kind>_<stat>_mib_<min|max>``) through ``Trainer.log``.

Kinds: ``gpu`` (allocated by the caching allocator, as in PEFT's block), ``gpu_reserved`` (held by the caching
allocator; what ``nvidia-smi`` roughly sees) and ``cpu`` (process RSS). Stats, in MiB: ``before`` (at phase start),
``consumed`` (end - begin, may be negative), ``peak`` (max - begin) and ``total_peak`` (max).

How peaks are found. Accelerator peaks come from the allocator's own high-water mark (``max_memory_allocated``),
which catches every spike; because phases nest (an evaluation inside training), the mark is folded into every open
phase and reset at each phase boundary. This resets the global peak counters, which other tools reading
``max_memory_allocated`` would notice (so leave Trainer's ``skip_memory_metrics`` at its default, True). Host RSS has no resettable high-water mark, so a daemon thread samples it
every ``sample_interval_s`` (a spike shorter than that can be missed; PEFT's example spins without sleeping, which
costs a whole core). The thread runs only while a phase is open.

Phases: ``train`` (``on_train_begin`` → ``on_train_end``), ``eval`` (from the step that triggers it → ``on_evaluate``;
a standalone ``trainer.evaluate()`` is only seen from its first prediction step on), ``save`` (from the step that
triggers a checkpoint → ``on_save``), ``predict``, and any phase the user wraps in ``with callback.phase(name):``
(model loading happens before the trainer exists, so only this can see it; every rank must enter it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil
from transformers import TrainerControl, TrainerState, TrainingArguments

from ..devices import device_memory_api
from ..distributed import gather_from_ranks, rank_and_world
from ._common import LoggingCallback

__all__ = ["MemoryTraceCallback", "format_memory_block"]

logger = logging.getLogger(__name__)

_MIB = 2**20
_STATS = ("before", "consumed", "peak", "total_peak")


@dataclass
class _OpenPhase:
    """One phase in progress on this rank: bytes at the start and the highest bytes seen so far, per kind."""

    name: str
    begin: dict[str, int]
    peak: dict[str, int] = field(default_factory=dict)

    def raise_peak(self, sample: dict[str, int]) -> None:
        for kind, value in sample.items():
            self.peak[kind] = max(self.peak.get(kind, value), value)


class _RssSampler:
    """Samples process RSS into every open phase from a daemon thread; the thread lives only while phases are open."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._process = psutil.Process()
        self._lock = threading.Lock()
        self._phases: list[_OpenPhase] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def rss(self) -> int:
        return self._process.memory_info().rss

    def track(self, phase: _OpenPhase) -> None:
        with self._lock:
            self._phases.append(phase)
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="hf_lora_ds-rss-sampler", daemon=True)
            self._thread.start()

    def untrack(self, phase: _OpenPhase) -> None:
        with self._lock:
            self._phases.remove(phase)
            idle = not self._phases
        if idle and self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            sample = {"cpu": self.rss()}
            with self._lock:
                for phase in self._phases:
                    phase.raise_peak(sample)


def _mib(n_bytes: int) -> float:
    return round(n_bytes / _MIB, 2)


def _phase_stats(phase: _OpenPhase, end: dict[str, int]) -> dict[str, dict[str, float]]:
    return {
        kind: {
            "before": _mib(begin),
            "consumed": _mib(end[kind] - begin),
            "peak": _mib(phase.peak[kind] - begin),
            "total_peak": _mib(phase.peak[kind]),
        }
        for kind, begin in phase.begin.items()
    }


def _range(ranks: list[dict[str, Any]], kind: str, stat: str) -> str:
    values = [r[kind][stat] for r in ranks]
    low, high = min(values), max(values)
    if len(values) == 1 or low == high:
        return f"{low:.1f}"
    return f"{low:.1f} .. {high:.1f} (min .. max over {len(values)} ranks)"


def format_memory_block(record: dict[str, Any]) -> str:
    """The lines PEFT's DeepSpeed examples print, in MiB, for one gathered phase record."""
    phase, ranks = record["phase"], record["ranks"]
    lines = []
    for kind, label in (("gpu", "GPU"), ("cpu", "CPU")):
        if kind in ranks[0]:
            lines += [
                f"{label} Memory before entering the {phase} : {_range(ranks, kind, 'before')}",
                f"{label} Memory consumed at the end of the {phase} (end-begin): {_range(ranks, kind, 'consumed')}",
                f"{label} Peak Memory consumed during the {phase} (max-begin): {_range(ranks, kind, 'peak')}",
                f"{label} Total Peak Memory consumed during the {phase} (max): {_range(ranks, kind, 'total_peak')}",
            ]
    if "gpu_reserved" in ranks[0]:
        lines.append(
            f"GPU Reserved Total Peak Memory during the {phase} (max): {_range(ranks, 'gpu_reserved', 'total_peak')}"
        )
    return "\n".join(lines)


def _metrics(record: dict[str, Any]) -> dict[str, float]:
    out = {}
    ranks = record["ranks"]
    for kind in ranks[0]:
        if kind == "rank":
            continue
        for stat in _STATS:
            values = [r[kind][stat] for r in ranks]
            out[f"memory/{record['phase']}/{kind}_{stat}_mib_min"] = min(values)
            out[f"memory/{record['phase']}/{kind}_{stat}_mib_max"] = max(values)
    return out


class MemoryTraceCallback(LoggingCallback):
    """Traces accelerator memory and host RAM per phase and rank; works in any ``transformers.Trainer``.

    >>> memory = MemoryTraceCallback()
    >>> with memory.phase("load"):          # doctest: +SKIP
    ...     model = AutoModelForCausalLM.from_pretrained(path)
    >>> trainer = Trainer(model=model, args=args, train_dataset=ds)  # doctest: +SKIP
    >>> memory.attach(trainer)              # doctest: +SKIP

    ``records`` holds every gathered phase (``{"phase", "step", "ranks": [{"rank", "cpu": {...}, ...}]}``); rank 0
    also writes them to ``<output_dir>/<trace_file>`` for ``report.html``.
    """

    def __init__(
        self, sample_interval_s: float = 0.01, print_blocks: bool = True, trace_file: str | None = "memory_trace.json"
    ) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self._print_blocks = print_blocks
        self._trace_file = trace_file
        self._sampler = _RssSampler(sample_interval_s)
        self._device = device_memory_api()
        self._open: dict[str, _OpenPhase] = {}
        self._pending: list[dict[str, Any]] = []  # finished on this rank, not yet gathered
        self._state: TrainerState | None = None
        self._output_dir: str | None = None

    # ---- measuring on this rank ----

    def _read(self) -> dict[str, int]:
        sample = {"cpu": self._sampler.rss()}
        if self._device is not None:
            sample["gpu"] = self._device.memory_allocated()
            sample["gpu_reserved"] = self._device.memory_reserved()
        return sample

    def _fold_device_peaks(self) -> None:
        """Give every open phase the allocator's high-water mark since the last boundary, then restart the mark."""
        if self._device is None:
            return
        peaks = {"gpu": self._device.max_memory_allocated(), "gpu_reserved": self._device.max_memory_reserved()}
        for phase in self._open.values():
            phase.raise_peak(peaks)
        self._device.reset_peak_memory_stats()

    def _begin(self, name: str) -> None:
        if name in self._open:
            return
        self._fold_device_peaks()
        now = self._read()
        self._raise_open_peaks(now)
        phase = _OpenPhase(name, begin=now, peak=dict(now))
        self._open[name] = phase
        self._sampler.track(phase)

    def _end(self, name: str, record_as: str | None = None) -> bool:
        """Close phase ``name`` on this rank and queue its numbers; False when it was not open."""
        if name not in self._open:
            return False
        self._fold_device_peaks()
        phase = self._open.pop(name)
        self._sampler.untrack(phase)
        end = self._read()
        phase.raise_peak(end)
        self._raise_open_peaks(end)
        self._pending.append({"phase": record_as or name, "stats": _phase_stats(phase, end)})
        return True

    def _raise_open_peaks(self, sample: dict[str, int]) -> None:
        """A boundary reading counts for every enclosing phase too: the sampler thread may never see that value."""
        for phase in self._open.values():
            phase.raise_peak(sample)

    # ---- publishing across ranks ----

    def _publish(self, state: TrainerState) -> None:
        """Gather the queued phases from every rank, print them on rank 0, log them on all (a collective)."""
        local, self._pending = self._pending, []
        per_rank = gather_from_ranks(local)
        for index, entry in enumerate(per_rank[0]):
            ranks = [{"rank": r, **records[index]["stats"]} for r, records in enumerate(per_rank)]
            record = {"phase": entry["phase"], "step": state.global_step, "ranks": ranks}
            self.records.append(record)
            if self._print_blocks and rank_and_world()[0] == 0:
                print(format_memory_block(record), flush=True)
            self._emit(state, _metrics(record))
        self._write_trace_file()

    def _write_trace_file(self) -> None:
        if self._trace_file is None or self._output_dir is None or rank_and_world()[0] != 0:
            return
        os.makedirs(self._output_dir, exist_ok=True)
        with open(os.path.join(self._output_dir, self._trace_file), "w", encoding="utf-8") as f:
            json.dump(self.records, f, indent=1)

    def _finish(self, state: TrainerState, name: str, record_as: str | None = None) -> None:
        if self._end(name, record_as):
            self._publish(state)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Trace a phase the trainer cannot see (model load, a final ``save_model``). Enter it on every rank."""
        self._begin(name)
        try:
            yield
        except BaseException:
            if self._end(name):
                self._pending.pop()  # no collective while this rank is failing: the others would wait forever
            raise
        self._end(name)
        if self._state is not None:  # otherwise logged when training begins
            self._publish(self._state)

    # ---- trainer events ----

    def _remember(self, args: TrainingArguments, state: TrainerState) -> None:
        self._state, self._output_dir = state, args.output_dir

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._remember(args, state)
        if self._pending:
            self._publish(state)
        self._begin("train")
        if args.eval_on_start:
            self._begin("eval")

    def _after_step_or_epoch(self, control: TrainerControl) -> None:
        if control.should_evaluate:
            self._begin("eval")  # a save that follows begins when the evaluation ends
        elif control.should_save:
            self._begin("save")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._after_step_or_epoch(control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._after_step_or_epoch(control)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._remember(args, state)
        self._begin("eval")  # no-op inside training; a standalone evaluate()/predict() is seen from here on

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "eval")
        if control.should_save:
            self._begin("save")

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "eval", record_as="predict")

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "save")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        for name in ("eval", "save"):  # left open only if training stopped between trigger and event
            self._end(name)
        self._finish(state, "train")
