"""Shims over third-party behaviour that costs a run time and buys it nothing; each keeps the library's results."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["defer_deepspeed_kernel_compiles"]

_MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"


def defer_deepspeed_kernel_compiles() -> None:
    """Let DeepSpeed's ``torch.compile``-decorated kernels (its Muon optimizer's) be compiled at their first call.

    ZeRO's optimizer imports them on every run, Muon or not, and decorating with ``torch.compile`` imports torch's
    compiler stack (~540 modules, 1-2 s of every rank's start). ``torch.compile`` compiles on the first call anyway,
    so a run that uses Muon gets the same kernels. Idempotent; a no-op once the kernels are imported, or without
    DeepSpeed."""
    if _MUON_KERNELS in sys.modules:
        return
    try:
        from deepspeed.runtime import compiler
    except ImportError:
        return
    if callable(getattr(compiler, "compile", None)):
        compiler.compile = _compile_on_first_call


def _compile_on_first_call() -> Callable[[Callable], Callable]:
    """What ``deepspeed.runtime.compiler.compile()`` returns (``torch.compile`` as a decorator), made lazy."""

    def decorate(function: Callable) -> Callable:
        compiled: Callable | None = None

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                import torch

                compiled = torch.compile(function)
            return compiled(*args, **kwargs)

        return call

    return decorate
