"""Public names of a package that import their modules on first use (PEP 562): importing the package itself loads
none of them, so ``python -m hf_lora_ds.<command>`` reaches the command's own start (hf_lora_ds.command_process)
before torch, transformers or PEFT, and the doctor runs where one of them is missing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names are ``exports`` (name: its module)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(exports[name]), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
