"""What a command of this package does to its own process, and only there: the library changes nothing in a caller's.

Every rank of a launch and every command line starts by importing torch, transformers, PEFT and DeepSpeed: ~450k
objects that live as long as the process and make almost no garbage, yet their allocations trigger full collections,
and every later full collection (Trainer runs one as training starts) walks them again, about a fifth of each
process's import time (bench/startup.py). A command owns its process, so it imports with the cyclic collector off and
then freezes what it imported (``gc.freeze``), and quiets the third-party lines its user cannot act on
(hf_lora_ds.quiet). ``import hf_lora_ds`` and its modules do neither: a notebook that imports the package keeps its
collector, its warning filters and its import system as they were.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module

__all__ = ["command_imports", "doctor", "imports_kept_from_the_collector", "run_command", "sft"]


@contextmanager
def imports_kept_from_the_collector() -> Iterator[None]:
    """The cyclic garbage collector off inside; afterwards every object alive is frozen and the collector is back as
    it was. The collection first: garbage made before is freed, not frozen."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


@contextmanager
def command_imports() -> Iterator[None]:
    """Import a command's modules inside: kept from the collector, and PEFT imported the quiet way first (it must
    come before anything that imports PEFT: hf_lora_ds.quiet)."""
    from hf_lora_ds.quiet import quiet_third_party_noise

    with imports_kept_from_the_collector():
        quiet_third_party_noise()
        yield


def run_command(module: str, function: str = "cli") -> None:
    """``module.function()``, a command line's entry, with its imports made as ``command_imports`` makes them."""
    with command_imports():
        entry = getattr(import_module(module), function)
    entry()


def sft() -> None:
    """The installed command ``hf-lora-sft`` (hf_lora_ds.cli.run)."""
    run_command("hf_lora_ds.cli.run")


def doctor() -> None:
    """The installed command ``hf-lora-doctor`` (hf_lora_ds.cli.doctor)."""
    run_command("hf_lora_ds.cli.doctor")
