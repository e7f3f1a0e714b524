"""Ranks and the process group, as every part of the package sees them: who prints (``print0``), gathering a value
from every rank, rank 0 first for shared caches, and leaving a launched rank cleanly. The launch itself (making
Trainer's, accelerate's and DeepSpeed's world sizes agree) is hf_lora_ds.launch.world's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import torch
from tqdm import tqdm

__all__ = [
    "launcher_world_size",
    "release_process_group",
    "exit_launched_rank",
    "print0",
    "process_group_exists",
    "rank_and_world",
    "gather_from_ranks",
    "main_process_first",
]

# The variables accelerate itself reads for the world size of a CPU launch (torchrun/deepspeed, then MPI flavours).
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_world_size() -> int:
    """Number of processes the launcher started (1 for a plain ``python`` run)."""
    for name in _WORLD_SIZE_VARIABLES:
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


def release_process_group() -> None:
    """Wait for every rank, then destroy the default process group; call it last, once the job's work is done.

    A process that exits with its gloo group alive can abort in interpreter teardown ("terminate called without an
    active exception", SIGABRT: gloo's worker threads outlive the interpreter, pytorch#190489), so the launcher
    reports a finished job as failed (CI caught it on a 2-rank ZeRO-3 run). The barrier keeps a rank from tearing its
    group down while another still talks to it (the last save). No-op without a process group.
    """
    if process_group_exists():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def exit_launched_rank(code: int) -> NoReturn:
    """Leave a rank of a multi-process launch without interpreter teardown, once its work is done and its process
    group released (``release_process_group``); a single process exits normally (``sys.exit``).

    C++ threads of the communication libraries (gloo's, DeepSpeed's CPU ops) can outlive the destroyed group; their
    destructors then run in interpreter teardown and call std::terminate ("terminate called without an active
    exception", SIGABRT), and the launcher reports a finished job as failed. Seen again in CI after the group release:
    rank 1 of a resumed 2-rank ZeRO-3 + CPU-offload run, after its final save. Output is flushed first; nothing else
    of this package runs at exit.
    """
    if launcher_world_size() <= 1:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def process_group_exists() -> bool:
    """Whether a torch.distributed default group is up (torch builds without distributed support have none)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """This process's global rank and the world size; before the process group exists, the launcher's ``RANK`` and 1
    (so rank-0-only printing is right from the first line)."""
    if process_group_exists():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), 1


def print0(*lines: str) -> None:
    """Print on global rank 0 only, flushed: the one way the package talks to the user, so a 2-rank run shows each
    line once and in order with the launcher's own output. Written through tqdm, which lifts a live progress bar
    (Trainer's) off the terminal first and redraws it below: lines printed during training (an evaluation's memory,
    a divergence warning) get lines of their own, not the end of the bar's."""
    if rank_and_world()[0] == 0:
        tqdm.write("\n".join(lines), file=sys.stdout)
        sys.stdout.flush()


def gather_from_ranks(obj: Any) -> list[Any]:
    """``obj`` from every rank, in rank order, on every rank (``[obj]`` without a process group). A collective:
    every rank must call it at the same point."""
    world_size = rank_and_world()[1]
    if world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first (reading data into the cache, tokenizing); the other ranks run it after, and
    find the cache written, instead of all ranks racing to write the same files."""
    distributed = process_group_exists()
    is_main = not distributed or torch.distributed.get_rank() == 0
    if distributed and not is_main:
        torch.distributed.barrier()
    yield
    if distributed and is_main:
        torch.distributed.barrier()
