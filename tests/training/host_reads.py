"""Counting the package's device-to-host reads on a CPU run: every ``torch.Tensor`` call that would make the host wait
for a GPU (``.item()``, ``bool()``, ``.tolist()``, ``.nonzero()``, a boolean-mask index, ``torch.equal``, a copy to
the CPU...), counted when the code that made it is this package's."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import hf_lora_ds

PACKAGE = str(Path(hf_lora_ds.__file__).parent)
TORCH = str(Path(torch.__file__).parent)
DATA_LOADING = str(Path(torch.__file__).parent / "utils" / "data")

# Tensor methods whose answer is on the host, so that on a GPU they wait for the device's queue.
READING_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "numpy", "cpu", "equal")
# Functions of torch with the same property.
READING_FUNCTIONS = ("equal", "nonzero", "masked_select", "is_nonzero")


# transformers functions that read the device only for what the package hands them: a boolean logits_to_keep.
ON_THE_PACKAGE_S_BEHALF = ("slice_logits_to_keep",)


def _caller(everyone: bool) -> str | None:
    """``file:line`` of the innermost frame outside torch (and this module) when it is the package's (or reads on
    its behalf), else None: Trainer's and the model's own reads are theirs. ``everyone``: theirs too, as
    ``parent/file:line``."""
    frame = sys._getframe(3)
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH) or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None or _collating(frame):
        return None
    if frame.f_code.co_name in ON_THE_PACKAGE_S_BEHALF:
        return f"transformers {frame.f_code.co_name}"
    if not frame.f_code.co_filename.startswith(PACKAGE):
        path = Path(frame.f_code.co_filename)
        return f"{path.parent.name}/{path.name}:{frame.f_lineno}" if everyone else None
    return f"{Path(frame.f_code.co_filename).relative_to(PACKAGE)}:{frame.f_lineno}"


def _collating(frame: Any) -> bool:
    """Whether ``frame`` runs inside a DataLoader's fetch: a collator's tensors are on the host by construction."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(DATA_LOADING):
            return True
        frame = frame.f_back
    return False


def _is_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(item, torch.Tensor) and item.dtype == torch.bool for item in items)


class HostReads:
    """Calls counted per ``where`` (``file:line`` of the package; of any code with ``everyone``) for the current
    ``step``; ``reads[step]``."""

    def __init__(self, everyone: bool = False) -> None:
        self.step, self.everyone = 0, everyone
        self.reads: dict[int, Counter[str]] = {}

    def count(self, what: str) -> None:
        where = _caller(self.everyone)
        if where is not None:
            self.reads.setdefault(self.step, Counter())[f"{where} {what}"] += 1


@contextmanager
def counting_host_reads(everyone: bool = False) -> Iterator[HostReads]:
    """Within the block every reading call the package makes (``everyone``: any code outside the DataLoader's
    collation) is counted in the yielded ``HostReads``."""
    reads = HostReads(everyone)
    with _ReadingCalls(reads):
        yield reads


class _ReadingCalls(TorchFunctionMode):
    """Every reading call seen as the torch function it is, nothing patched: a method set on torch.Tensor and taken
    away again can leave the type changed at the C level (``__getitem__``: a sequence, and ``torch.tensor([tensor(1)])``
    then fails in every later test of the process)."""

    READS = frozenset(
        [getattr(torch.Tensor, name) for name in (*READING_METHODS, "masked_select")]
        + [getattr(torch, name) for name in READING_FUNCTIONS]
    )

    def __init__(self, reads: HostReads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in self.READS or (func is torch.Tensor.__getitem__ and _is_mask(args[1])):
            self.reads.count(func.__name__)
        return func(*args, **(kwargs or {}))
