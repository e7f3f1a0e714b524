"""Which module answers accelerator memory questions, for every torch in the supported range.

``torch.accelerator`` covers every backend but gained its memory functions only in torch 2.9; before that, CUDA
(and ROCm, which presents itself as CUDA) answers through ``torch.cuda``. On a CPU-only host there is no device
memory to report: callers then report host RSS alone.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["device_memory_api"]

logger = logging.getLogger(__name__)


def device_memory_api() -> Any:
    """``torch.accelerator`` (torch >= 2.9), else ``torch.cuda`` when CUDA is up, else ``None``. The module returned
    has ``synchronize``, ``memory_allocated``, ``max_memory_allocated`` and ``reset_peak_memory_stats``."""
    if hasattr(torch.accelerator, "max_memory_allocated") and torch.accelerator.is_available():
        api = torch.accelerator
    elif torch.cuda.is_available():
        api = torch.cuda
    else:
        return None
    try:
        api.memory_allocated()
    except RuntimeError as err:  # a backend without allocator statistics
        logger.warning("Accelerator memory is not traced: %s", err)
        return None
    return api
