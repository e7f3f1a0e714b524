"""The accelerator a process can use and its memory (``torch.accelerator``, every backend), and the run's dtype by
device. On a CPU-only host there is no device memory to report: callers then report host RSS alone.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["auto_dtype", "available_accelerator", "device_memory_api", "free_device_memory"]

logger = logging.getLogger(__name__)


def available_accelerator() -> torch.device | None:
    """The accelerator this process can use, None where there is none. ``current_accelerator()`` alone names the
    backend torch was built for: PyPI's Linux torch, a CUDA build, says cuda on a machine without a GPU."""
    return torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None


def device_memory_api() -> Any:
    """``torch.accelerator`` when one is up, else ``None``. The module returned has ``synchronize``,
    ``memory_allocated``, ``max_memory_allocated`` and ``reset_peak_memory_stats``."""
    if not torch.accelerator.is_available():
        return None
    try:
        torch.accelerator.memory_allocated()
    except RuntimeError as err:  # a backend without allocator statistics
        logger.warning("Accelerator memory is not traced: %s", err)
        return None
    return torch.accelerator


def free_device_memory(device: torch.device) -> int:
    """Bytes free on the accelerator ``device`` (by the driver, other processes' use included)."""
    return torch.accelerator.get_memory_info(device)[0]


def auto_dtype(on_accelerator: bool, fp16: bool = False) -> str:
    """``--dtype auto``, for the run and for the planner alike: bfloat16 on an accelerator that computes in it, float32
    elsewhere (bf16 LoRA ran ~20x slower than fp32 on CPUs) and with ``--fp16``, whose scaler wants float32 weights.
    An accelerator planned from a machine without CUDA is taken to have bf16 (every GPU since Ampere)."""
    if not on_accelerator or fp16:
        return "float32"
    return "bfloat16" if not torch.cuda.is_available() or torch.cuda.is_bf16_supported() else "float32"
