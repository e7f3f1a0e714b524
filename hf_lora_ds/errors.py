"""One error boundary for every command line of the package: a user's mistake is one line, a bug keeps its traceback.

A wrong path, a bad record or a contradictory flag used to end in a Python traceback whose last line often named
neither the file nor the fix. Code that detects such a mistake raises ``UserError`` (or a subclass) with a message
that says what is wrong, where, and what to do; ``run_cli`` turns it into

    error: <message>

on stderr, from rank 0 only under ``torchrun``/``deepspeed`` (the other ranks exit with the same code, silently;
an error only another rank hit is handed to rank 0 to print: ``hf_lora_ds.distributed.ErrorRelay``), and exit code
``USER_ERROR_EXIT_CODE`` (2, argparse's code for bad usage). Every other exception is a bug in this package or a
library and keeps its traceback. ``HF_LORA_DS_DEBUG=1`` shows the traceback of user errors too.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from hf_lora_ds.distributed import ErrorRelay, exit_launched_rank, launcher_world_size

__all__ = ["USER_ERROR_EXIT_CODE", "DEBUG_VARIABLE", "UserError", "MissingPathError", "one_line", "run_cli"]

USER_ERROR_EXIT_CODE = 2
DEBUG_VARIABLE = "HF_LORA_DS_DEBUG"
_OTHER_RANKS_GRACE_S = 5.0


class UserError(ValueError):
    """A mistake in the user's input (flag, file, config) that they can fix; the message says what, where and how.

    A ``ValueError`` so that code catching the ValueErrors this package raised before keeps working.
    """


class MissingPathError(UserError, FileNotFoundError):
    """A file or directory the user named does not exist (still a ``FileNotFoundError`` for existing callers)."""


def one_line(message: str) -> str:
    """The message with its lines joined, so a launcher's per-rank prefixing cannot split it."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def run_cli(main: Callable[[], Any]) -> NoReturn:
    """Run a command line's ``main`` and exit: its int return value (0 for anything else), the code of a
    ``SystemExit`` it raises, or 2 on a ``UserError``.

    Use as ``if __name__ == "__main__": run_cli(main)``.
    """
    relay = ErrorRelay()
    if launcher_world_size() > 1:
        relay.start(_say, lambda: exit_launched_rank(USER_ERROR_EXIT_CODE))
    try:
        result = main()
    except UserError as err:
        if _debugging():
            raise
        _exit_on_user_error(err, relay)
    except SystemExit as leaving:  # a preempted run's code 75: out of a launched rank without teardown too
        if not isinstance(leaving.code, int):
            raise
        result = leaving.code
    exit_launched_rank(result if isinstance(result, int) else 0)


def _debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def _exit_on_user_error(err: UserError, relay: ErrorRelay) -> NoReturn:
    """Print the one line, then leave: rank 0 at once; any other rank hands its line to rank 0 (``ErrorRelay``) and
    leaves silently once rank 0 has said it, else says it itself after a grace period, prefixed with its rank.
    Every rank usually hits the same error, and launchers (torchrun's elastic agent, accelerate, deepspeed) end every
    rank once one exits, so rank 0's line is the only one; a rank that failed first would otherwise get rank 0
    killed before it printed (seen under accelerate launch). An error of one rank alone (its partition of a
    checkpoint did not fit the disk) is said by rank 0's relay thread, even while rank 0 waits in a collective.

    The process group is torn down first: a gloo group alive at interpreter exit can abort the process
    (``terminate called without an active exception``) and turn exit code 2 into a SIGABRT. No barrier: another
    rank may not have reached the error, and waiting for it would hang. A launched rank then leaves without
    interpreter teardown (``exit_launched_rank``): after an error raised once the group existed (an FSDP config
    refused under ``accelerate launch``), rank 0's teardown was seen stuck in garbage collection until the other
    rank's grace period ran out, and both lines were printed.
    """
    rank = int(os.environ.get("RANK", "0"))
    message = one_line(str(err))
    _close_progress_bars()
    if rank == 0:
        relay.say(message, _say)
        if relay.store is not None:
            relay.wait_until_seen()
    elif not relay.publish(message, _OTHER_RANKS_GRACE_S):
        if relay.store is None:
            time.sleep(_OTHER_RANKS_GRACE_S)
        _say(f"(rank {rank}) {message}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    exit_launched_rank(USER_ERROR_EXIT_CODE)


def _say(message: str) -> None:
    # One write, newline included: unbuffered, print() writes the text and its newline apart, and another rank's
    # output could land between them, on the error's line.
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def _close_progress_bars() -> None:
    """An error raised during training would otherwise be printed after the progress bar, on its line."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
