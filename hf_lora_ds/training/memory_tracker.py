"""The one memory tracker: accelerator memory and host RSS over nested phases, for the callbacks and the eval alike.

Why one: the accelerator's peak counter is global to the process, and a tracker that resets it erases the peak of
every block around it, so every reset first folds the peak into every open phase (``_fold_device_peaks``). Host RSS
has no nesting high-water mark, so a daemon thread samples it every ``sample_interval_s`` (a shorter spike can be
missed; sampling without sleeping costs a core). Leave Trainer's ``skip_memory_metrics`` at True: it reads the counter.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from itertools import count

import psutil
import torch

from hf_lora_ds.devices import device_memory_api

__all__ = ["MemoryTracker", "PhaseStats", "PeakMemory", "measure_peak"]

PhaseStats = dict[str, dict[str, int]]  # kind ("cpu", "gpu", "gpu_reserved") -> before/consumed/peak/total_peak
_LIVE_TRACKERS: weakref.WeakSet[MemoryTracker] = weakref.WeakSet()
_ANONYMOUS = count()


@dataclass
class _OpenPhase:
    """One phase in progress: bytes at the start and the highest bytes seen so far, per kind."""

    name: str
    begin: dict[str, int]
    peak: dict[str, int] = field(default_factory=dict)

    def raise_peak(self, sample: dict[str, int]) -> None:
        for kind, value in sample.items():
            self.peak[kind] = max(self.peak.get(kind, value), value)

    def stats(self, end: dict[str, int]) -> PhaseStats:
        return {
            kind: {
                "before": begin,
                "consumed": end[kind] - begin,
                "peak": self.peak[kind] - begin,
                "total_peak": self.peak[kind],
            }
            for kind, begin in self.begin.items()
        }


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
        """Stop sampling ``phase``; with no phase left, stop the thread and wait for it: it is gone when this
        returns, so a run that ended leaves no thread reading this process behind."""
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


class MemoryTracker:
    """Named phases that may nest; ``end(name)`` returns the phase's bytes per kind (see ``PhaseStats``).

    ``device``: the accelerator whose allocator is read (None: the current one); a model on the CPU of a GPU host
    passes ``torch.device("cpu")`` and gets host RSS alone.
    """

    def __init__(self, sample_interval_s: float = 0.01, device: torch.device | str | None = None) -> None:
        self._sampler = _RssSampler(sample_interval_s)
        self._device = None if device is None else torch.device(device)
        api = device_memory_api()
        self._api = api if api is not None and (self._device is None or self._device.type != "cpu") else None
        self._open: dict[str, _OpenPhase] = {}
        _LIVE_TRACKERS.add(self)

    def read(self) -> dict[str, int]:
        sample = {"cpu": self._sampler.rss()}
        if self._api is not None:
            sample["gpu"] = self._api.memory_allocated(*self._on())
            sample["gpu_reserved"] = self._api.memory_reserved(*self._on())
        return sample

    def begin(self, name: str) -> None:
        """Open phase ``name``; a phase already open stays as it is."""
        if name in self._open:
            return
        _fold_device_peaks()
        now = self.read()
        self._raise_open_peaks(now)
        phase = _OpenPhase(name, begin=now, peak=dict(now))
        self._open[name] = phase
        self._sampler.track(phase)

    def end(self, name: str) -> PhaseStats | None:
        """Close phase ``name`` and return its bytes; None when it was not open."""
        if name not in self._open:
            return None
        _fold_device_peaks()
        phase = self._open.pop(name)
        self._sampler.untrack(phase)
        end = self.read()
        phase.raise_peak(end)
        self._raise_open_peaks(end)
        return phase.stats(end)

    def abandon(self) -> None:
        """Close every open phase unmeasured, which stops the sampler thread: for a run that failed, whose phases
        Trainer's events will never end."""
        for phase in self._open.values():
            self._sampler.untrack(phase)
        self._open.clear()

    @contextmanager
    def phase(self, name: str | None = None) -> Iterator[PeakMemory]:
        """``with tracker.phase() as peak:`` measures the block; ``peak`` is filled in when the block ends."""
        name = name or f"block-{next(_ANONYMOUS)}"
        peak = PeakMemory()
        self.begin(name)
        try:
            yield peak
        finally:
            stats = self.end(name)
            peak.host_rss_bytes = stats["cpu"]["total_peak"]
            peak.accelerator_bytes = stats["gpu"]["total_peak"] if "gpu" in stats else None

    def _on(self) -> tuple[torch.device, ...]:
        return () if self._device is None else (self._device,)

    def _fold_own_peaks(self) -> None:
        """Raise this tracker's open phases to the allocator's high-water mark since the last reset."""
        if self._api is not None and self._open:
            peaks = {
                "gpu": self._api.max_memory_allocated(*self._on()),
                "gpu_reserved": self._api.max_memory_reserved(*self._on()),
            }
            self._raise_open_peaks(peaks)

    def _raise_open_peaks(self, sample: dict[str, int]) -> None:
        """A boundary reading counts for every enclosing phase too: the sampler thread may never see that value."""
        for phase in self._open.values():
            phase.raise_peak(sample)


@dataclass
class PeakMemory:
    """The highest bytes a measured block reached: accelerator memory (None without one) and host RSS."""

    accelerator_bytes: int | None = None
    host_rss_bytes: int | None = None


def measure_peak(device: torch.device | str) -> AbstractContextManager[PeakMemory]:
    """``with measure_peak(model.device) as peak:`` — a block's peak memory, nested safely in any traced phase."""
    return MemoryTracker(device=device).phase()


def _fold_device_peaks() -> None:
    """Every open phase of every tracker gets the allocator's high-water mark so far; then the mark restarts."""
    apis = {}
    for tracker in list(_LIVE_TRACKERS):
        tracker._fold_own_peaks()
        if tracker._api is not None:
            apis[id(tracker._api)] = tracker._api
    for api in apis.values():
        api.reset_peak_memory_stats()
