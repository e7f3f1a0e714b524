"""Ranks and the process group, as every part of the package sees them: who says an error one rank alone hit
(``ErrorRelay``; the package's other messages go through hf_lora_ds.cli.log), gathering a value from every rank, rank 0
first for shared caches, and leaving a launched rank cleanly. The launch itself (making Trainer's, accelerate's and
DeepSpeed's world sizes agree) is hf_lora_ds.launch.world's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NoReturn

import torch

__all__ = [
    "ErrorRelay",
    "WORLD_SIZE_VARIABLES",
    "describe_world",
    "effective_global_batch",
    "exit_launched_rank",
    "gather_from_ranks",
    "launcher_ranks_per_node",
    "launcher_world_size",
    "main_process_first",
    "process_group_exists",
    "rank_and_world",
    "release_process_group",
]

# The variables accelerate itself reads for the world size of a CPU launch (torchrun/deepspeed, then MPI flavours).
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_world_size() -> int:
    """Number of processes the launcher started (1 for a plain ``python`` run)."""
    for name in WORLD_SIZE_VARIABLES:
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


def launcher_ranks_per_node() -> int:
    """Processes the launcher started on this machine: torchrun's and accelerate's ``LOCAL_WORLD_SIZE``, the DeepSpeed
    launcher's ``LOCAL_SIZE``; without either, all of them (one machine)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or launcher_world_size())


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


class ErrorRelay:
    """Rank 0 says the error another rank alone hit, while rank 0 itself may be blocked in a collective.

    One rank's failure (its part of a checkpoint did not fit its disk) leaves the others waiting in the next
    collective, where no exception reaches them (NCCL waits for its timeout, 30 min by default; gloo fails only once
    the failed rank is gone). The failed rank ``publish``es its line in the launch's key-value store (the TCPStore at
    ``MASTER_ADDR:MASTER_PORT`` that every launcher's rendezvous runs, outside the collectives); on rank 0 a watcher
    thread ``say``s it, once, and acknowledges it. The failed rank then leaves silently; without a store, or an
    acknowledgement within its wait, it says the line itself. Rank 0 saying an error of its own waits (2 s at most)
    for the other ranks to read the acknowledgement: when every rank fails at once it is still the one line. Keys
    carry torchrun's run id and restart count: its agent's store outlives a restarted worker group.
    """

    POLL_S = 0.1
    SEEN_WAIT_S = 2.0

    def __init__(self) -> None:
        self.store: Any = None
        self.rank, self.world_size = 0, 1
        self._lock = threading.Lock()
        self._said = False
        run = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._prefix = f"hf_lora_ds/error/{run}/"

    def attach(self, store: Any, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size

    def start(self, say: Any, leave: Any) -> None:
        """Watch in a daemon thread once the process group is up: on rank 0, ``say(message)`` a peer's error and
        ``leave()``; elsewhere only attach, for ``publish``."""
        threading.Thread(target=self._watch, args=(say, leave), name="hf_lora_ds-error-relay", daemon=True).start()

    def _watch(self, say: Any, leave: Any) -> None:
        while not process_group_exists():
            time.sleep(self.POLL_S)
        try:
            store = torch.distributed.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(seconds=30),
            )
        except (KeyError, ValueError, RuntimeError):
            return  # no store to reach: every rank says its own error (publish finds none)
        self.attach(store, *rank_and_world())
        while self.rank == 0:
            message = self.peer_error()
            if message is not None and self.say(message, say):
                self.wait_until_seen()
                leave()
            time.sleep(self.POLL_S)

    def peer_error(self) -> str | None:
        """The first error another rank published, or None."""
        for rank in range(1, self.world_size):
            if self.store.check([self._prefix + f"rank{rank}"]):
                return self.store.get(self._prefix + f"rank{rank}").decode()
        return None

    def say(self, message: str, say: Any) -> bool:
        """``say(message)`` unless this rank already said an error; acknowledge it to the publishers."""
        with self._lock:
            if self._said:
                return False
            self._said = True
            say(message)
        if self.store is not None:
            with contextlib.suppress(RuntimeError):
                self.store.set(self._prefix + "said", "1")
        return True

    def publish(self, message: str, wait_s: float) -> bool:
        """Hand ``message`` to rank 0. True (stay silent) once rank 0 acknowledged it within ``wait_s``, or when the
        store is gone: under the deepspeed launcher rank 0 hosts it, so rank 0 has left, after its own line or
        traceback. False where this rank must say it itself (no store, no acknowledgement)."""
        if self.store is None or self.rank == 0:
            return False
        try:
            self.store.set(self._prefix + f"rank{self.rank}", message)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if self.store.check([self._prefix + "said"]):
                    self.store.set(self._prefix + f"seen{self.rank}", "1")
                    return True
                time.sleep(self.POLL_S)
        except RuntimeError:  # torch.distributed.DistNetworkError: the store left with rank 0
            return True
        return False

    def wait_until_seen(self) -> None:
        """Rank 0, before it exits: every other rank that fails too has read the acknowledgement, or
        ``SEEN_WAIT_S`` passed (a rank that does not fail never reads it)."""
        deadline = time.monotonic() + self.SEEN_WAIT_S
        others = [self._prefix + f"seen{rank}" for rank in range(1, self.world_size)]
        with contextlib.suppress(RuntimeError):
            while time.monotonic() < deadline and not all(self.store.check([key]) for key in others):
                time.sleep(self.POLL_S)


def effective_global_batch(args: Any, sequence_parallel: int = 1) -> int:
    """Samples (rows, when packed) per optimizer step over all ranks: the number DeepSpeed calls
    ``train_batch_size``. The ranks of a sequence-parallel group (``sequence_parallel`` ranks) train the same batch,
    so they count once."""
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size // sequence_parallel


def describe_world(args: Any, sequence_parallel: int = 1) -> str:
    """One line for rank 0 to print at start: ranks, device, backend and how the global batch is made up (groups of
    ``sequence_parallel`` ranks train one batch)."""
    state = args.distributed_state
    backend = getattr(state, "backend", None) or "none"
    groups = args.world_size // sequence_parallel
    replicas = (
        f"{args.world_size} ranks"
        if sequence_parallel == 1
        else (
            f"{groups} data-parallel group{'s' if groups > 1 else ''} (of {sequence_parallel} sequence-parallel ranks)"
        )
    )
    return (
        f"world size {args.world_size} (launcher {launcher_world_size()}), rank {args.process_index}, "
        f"device {args.device}, backend {backend}; global batch {effective_global_batch(args, sequence_parallel)} = "
        f"{args.per_device_train_batch_size} per device x {args.gradient_accumulation_steps} accumulation x {replicas}"
    )
