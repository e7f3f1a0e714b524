"""Shims over third-party behaviour that costs a run time and buys it nothing; each keeps the library's results, and
each is in place only for the run that needs it: the libraries are their own again after it."""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["attribute_kept", "attribute_replaced", "deepspeed_startup_trimmed", "items_replaced"]

_MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"


@contextlib.contextmanager
def deepspeed_startup_trimmed() -> Iterator[None]:
    """Inside: DeepSpeed skips the work it does on every rank's start that no run needs (enter it before the engine
    is built, and around ``deepspeed.comm``'s initialisation). DeepSpeed and py-cpuinfo get their own functions back
    on the way out; a no-op without them."""
    with _kernel_compiles_deferred(), _first_cpu_info_kept(), _cpu_shared_memory_allreduce_skipped():
        yield


@contextlib.contextmanager
def attribute_kept(owner: Any, name: str) -> Iterator[None]:
    """``owner.name`` after the block (or each call of a function it decorates) is what it was on entering it."""
    original = getattr(owner, name)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def attribute_replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside, and what it was after (whatever the block set it to)."""
    with attribute_kept(owner, name):
        setattr(owner, name, value)
        yield


@contextlib.contextmanager
def items_replaced(mapping: dict, **values: Any) -> Iterator[None]:
    """``mapping`` holds ``values`` inside, and what it held after (a key it had not, none)."""
    missing = object()
    originals = {key: mapping.get(key, missing) for key in values}
    mapping.update(values)
    try:
        yield
    finally:
        for key, original in originals.items():
            if original is missing:
                mapping.pop(key, None)
            else:
                mapping[key] = original


def _kernel_compiles_deferred() -> contextlib.AbstractContextManager:
    """DeepSpeed's ``torch.compile``-decorated kernels (its Muon optimizer's), when imported inside, compiled at
    their first call.

    ZeRO's optimizer imports them on every run, Muon or not, and decorating with ``torch.compile`` imports torch's
    compiler stack (~540 modules). ``torch.compile`` compiles on the first call anyway, so a run that uses Muon gets
    the same kernels. Nothing to do once the kernels are imported."""
    if _MUON_KERNELS in sys.modules:
        return contextlib.nullcontext()
    try:
        from deepspeed.runtime import compiler
    except ImportError:
        return contextlib.nullcontext()
    if not callable(getattr(compiler, "compile", None)):
        return contextlib.nullcontext()
    return attribute_replaced(compiler, "compile", _compile_on_first_call)


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


def _cpu_shared_memory_allreduce_skipped() -> contextlib.AbstractContextManager:
    """``deepspeed.comm``'s backend, made inside, goes without DeepSpeed's CPU shared-memory allreduce (``shm_comm``).

    On the CPU accelerator every backend JIT-builds it (1-3 min on a machine's first run) and maps a ~69 MB buffer
    per rank in /dev/shm, for ``inference_all_reduce`` alone (tensor-parallel inference layers), which without it
    is torch.distributed's ``all_reduce``, as training's collectives always are. Other accelerators have no such op."""
    try:
        backend = importlib.import_module("deepspeed.comm.torch")  # the module: as an attribute, it is torch itself
    except ImportError:
        return contextlib.nullcontext()
    if not callable(getattr(backend, "build_shm_op", None)):
        return contextlib.nullcontext()
    return attribute_replaced(backend, "build_shm_op", _no_shared_memory_op)


def _no_shared_memory_op() -> None:
    """What ``build_shm_op`` returns where the op is not available."""
    return None


def _first_cpu_info_kept() -> contextlib.AbstractContextManager:
    """py-cpuinfo's ``get_cpu_info`` starts a Python interpreter on every call, and a rank that offloads to the CPU
    asks three times (DeepSpeed's CPU Adam: its build flags, then the optimizer). The CPU does not change within a
    process: inside, the first answer is kept, and each caller gets its own copy."""
    try:
        import cpuinfo
    except ImportError:
        return contextlib.nullcontext()
    first_answer = functools.cache(cpuinfo.get_cpu_info)

    def get_cpu_info() -> dict[str, Any]:
        return dict(first_answer())

    return attribute_replaced(cpuinfo, "get_cpu_info", get_cpu_info)
