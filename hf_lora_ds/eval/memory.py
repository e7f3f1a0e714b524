"""Peak memory over one block of code: accelerator memory when the model is on one, host RSS always.

Both peaks are reset on entry, so a before/after report shows what each eval needed rather than the process's
lifetime high-water mark (which would make "after" look at least as large as "before"). On Linux the host peak is
the kernel's ``VmHWM``, reset by writing 5 to ``/proc/self/clear_refs`` (as ``torch.cuda.reset_peak_memory_stats``
resets the GPU peak); other code that reads either peak across this block sees it reset, the same as with
transformers' own memory tracker. Where that file is missing or not writable, the current RSS at exit is reported.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import psutil
import torch

from hf_lora_ds.devices import device_memory_api

__all__ = ["PeakMemory"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class PeakMemory:
    """``with PeakMemory(model.device) as peak: ...``, then read ``peak.accelerator_bytes``, ``peak.host_rss_bytes``."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.accelerator_bytes: int | None = None
        self.host_rss_bytes: int | None = None
        self._host_peak_resettable = False
        api = device_memory_api()
        # A model on the CPU of a GPU host has no device peak to report.
        self._api = api if api is not None and self.device.type != "cpu" else None

    def __enter__(self) -> PeakMemory:
        if self._api is not None:
            self._api.synchronize(self.device)
            self._api.reset_peak_memory_stats(self.device)
        self._host_peak_resettable = _reset_host_peak()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._api is not None:
            self._api.synchronize(self.device)
            self.accelerator_bytes = self._api.max_memory_allocated(self.device)
        self.host_rss_bytes = _host_peak() if self._host_peak_resettable else psutil.Process().memory_info().rss


def _reset_host_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _host_peak() is not None


def _host_peak() -> int | None:
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None
