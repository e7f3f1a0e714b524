"""What a command of this package does to its own process, and only there: the library changes nothing in a caller's.

Every rank of a launch and every command line starts by importing torch, transformers, PEFT and DeepSpeed: ~450k
objects that live as long as the process and make almost no garbage, yet their allocations trigger full collections,
and every later full collection (Trainer runs one as training starts) walks them again, about a fifth of each
process's import time (bench/startup.py). A command owns its process, so it imports with the cyclic collector off and
then freezes what it imported (``gc.freeze``), and keeps out the third-party lines its user can do nothing about (the
constants below say why each one goes), everything else still showing. ``import hf_lora_ds`` and its modules do
neither: a notebook that imports the package keeps its collector, its warning filters and its import system as they
were.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module

__all__ = [
    "QUIETED_BITSANDBYTES_LOG",
    "QUIETED_COLLECTIVE_WARNING",
    "QUIETED_DEEPSPEED_LOG",
    "QUIETED_WARNING",
    "command_imports",
    "doctor",
    "imports_kept_from_the_collector",
    "quiet_third_party_noise",
    "run_command",
    "sft",
]

# transformers 5 warns on every PEFT wrap (PeftModel.__init__ reads the old attribute); the fix is PEFT's.
QUIETED_WARNING = r"`is_gradient_checkpointing` is deprecated"  # the start of transformers' message
# torch 2.13 deprecates both; DeepSpeed's ZeRO calls them every step, a warning pair per step and rank.
QUIETED_COLLECTIVE_WARNING = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
# DeepSpeed logs it on every import without an accelerator; the run's first line already names its device.
QUIETED_DEEPSPEED_LOG = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
# bitsandbytes on an AVX512-BF16 CPU, on import (PEFT imports it for every LoRA wrap); it falls back to its own kernel.
QUIETED_BITSANDBYTES_LOG = "Failed to load CPU gemm_4bit_forward from kernels-community: "  # then the import error
# The logger that emits each line (the filter must sit on it, see the module doc) and the line, or its start.
_QUIETED_LOGS = {
    "DeepSpeed": (QUIETED_DEEPSPEED_LOG, False),  # the logger DeepSpeed creates, by name, when imported
    "bitsandbytes.backends.cpu.ops": (QUIETED_BITSANDBYTES_LOG, True),  # its module's logger(__name__)
}


class _DropMessage(logging.Filter):
    def __init__(self, message: str, is_prefix: bool) -> None:
        super().__init__()
        self.message = message
        self.is_prefix = is_prefix

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith(self.message) if self.is_prefix else text == self.message)


def quiet_third_party_noise() -> None:
    """Install the filters and import PEFT without bitsandbytes; idempotent. Call it before PEFT is imported (a
    command's imports do: ``command_imports``). Each line is matched narrowly, by its own message on the logger that
    emits it, never by category or logger level (a parent logger's filters never see records its children
    propagate)."""
    for message in (QUIETED_WARNING, QUIETED_COLLECTIVE_WARNING):
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    for name, (message, is_prefix) in _QUIETED_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(message, is_prefix))
    _import_peft_without_bitsandbytes()


def _import_peft_without_bitsandbytes() -> None:
    if "peft" in sys.modules or "bitsandbytes" in sys.modules:
        return  # imported already, by the user's code: nothing left to spare
    try:
        import transformers  # noqa: F401  (imported first: only PEFT's own import may see bitsandbytes hidden)
    except ImportError:
        return  # named by the import that needs it (python -m hf_lora_ds.doctor lists every one)
    sys.modules["bitsandbytes"] = None  # `import bitsandbytes` raises ImportError, the case peft/helpers.py handles
    try:
        import peft  # noqa: F401
        from peft.import_utils import is_bnb_4bit_available

        is_bnb_4bit_available()  # cached False while hidden, until _PeftSeesBitsandbytesOnImport clears it
        sys.meta_path.insert(0, _PeftSeesBitsandbytesOnImport())
    except ImportError:
        pass  # as transformers above
    finally:
        del sys.modules["bitsandbytes"]


class _PeftSeesBitsandbytesOnImport(importlib.abc.MetaPathFinder):
    """PEFT's LoRA dispatch imports bitsandbytes on every wrap where it is installed, to test for its layers: 1.3 s
    of every rank's start on a CPU (torch's compiler comes with it). A process that never imported it holds none of
    its layers, so PEFT's cached "available" answers False until the first lookup of the module (a quantized load's
    import, or a check for it) clears the cache; then PEFT sees it as usual."""

    def find_spec(self, name, path=None, target=None):
        if name == "bitsandbytes":
            from peft.import_utils import is_bnb_4bit_available, is_bnb_available

            is_bnb_available.cache_clear()
            is_bnb_4bit_available.cache_clear()
            with contextlib.suppress(ValueError):  # another thread's lookup removed it first
                sys.meta_path.remove(self)
        return None  # the usual finders find it


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
    come before anything that imports PEFT: ``quiet_third_party_noise``)."""
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
