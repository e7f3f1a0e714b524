"""Shims over third-party behaviour that costs a run time and buys it nothing; each keeps the library's results."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["trim_deepspeed_startup"]

_MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"


def trim_deepspeed_startup() -> None:
    """Skip the work DeepSpeed does on every rank's start that no run needs; call it before the engine is built.
    Idempotent; a no-op without DeepSpeed."""
    _defer_kernel_compiles()
    _keep_first_cpu_info()


def _defer_kernel_compiles() -> None:
    """Let DeepSpeed's ``torch.compile``-decorated kernels (its Muon optimizer's) be compiled at their first call.

    ZeRO's optimizer imports them on every run, Muon or not, and decorating with ``torch.compile`` imports torch's
    compiler stack (~540 modules). ``torch.compile`` compiles on the first call anyway, so a run that uses Muon gets
    the same kernels. A no-op once the kernels are imported."""
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


def _keep_first_cpu_info() -> None:
    """py-cpuinfo's ``get_cpu_info`` starts a Python interpreter on every call, and a rank that offloads to the CPU
    asks three times (DeepSpeed's CPU Adam: its build flags, then the optimizer). The CPU does not change within a
    process: the first answer is kept, and each caller gets its own copy."""
    try:
        import cpuinfo
    except ImportError:
        return
    if getattr(cpuinfo.get_cpu_info, "keeps_first_answer", False):
        return
    first_answer = functools.cache(cpuinfo.get_cpu_info)

    def get_cpu_info() -> dict[str, Any]:
        return dict(first_answer())

    get_cpu_info.keeps_first_answer = True  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = get_cpu_info
