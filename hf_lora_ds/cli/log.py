"""The package's messages go through standard logging, as TRL's and PEFT's do: each module's logger is
``transformers.utils.logging.get_logger(__name__)``, all under the ``hf_lora_ds`` logger. Importing the package sets
no handler and no level, so a library user sees its warnings (Python's last-resort handler) and its info lines once
they configure logging (docs/callbacks.md).

A command of the package owns its process; there ``configure_logging`` gives the ``hf_lora_ds`` logger the lines it
always printed: plain, on stdout, rank 0 at info and the other ranks at warning, or as ``--log_level`` and
``--log_level_replica`` say.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from tqdm import tqdm
from transformers.utils.logging import log_levels

from hf_lora_ds.distributed import rank_and_world

if TYPE_CHECKING:
    from transformers import TrainingArguments

__all__ = ["PACKAGE_LOGGER", "ConsoleLines", "configure_logging", "process_log_level"]

PACKAGE_LOGGER = "hf_lora_ds"


class ConsoleLines(logging.Handler):
    """Each record as its plain message on ``sys.stdout`` (or ``sys.stderr``), looked up at each line (pytest's capture,
    a redirect), written through tqdm, which lifts a live progress bar (Trainer's) off the terminal first and redraws
    it below, so a line logged during training (an evaluation's memory, a divergence warning) gets a line of its own."""

    def __init__(self, stream: str = "stdout") -> None:
        super().__init__()
        self.stream = stream
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = getattr(sys, self.stream)
            # One write, newline included: tqdm writes its ``end`` apart, and another rank's output could come between.
            tqdm.write(self.format(record) + "\n", file=stream, end="")
            stream.flush()
        except Exception:
            self.handleError(record)


def process_log_level(args: TrainingArguments | None = None) -> int:
    """This rank's level: Trainer's ``--log_level`` on global rank 0 and ``--log_level_replica`` on the others (the
    fields of ``args``, when given), where "passive" (their default) means info on rank 0 and warning elsewhere, so the
    other ranks stay quiet and a line shows once."""
    if rank_and_world()[0] == 0:
        name, passive = args.log_level if args is not None else "passive", logging.INFO
    else:
        name, passive = args.log_level_replica if args is not None else "passive", logging.WARNING
    return passive if name == "passive" else log_levels[name]


def configure_logging(args: TrainingArguments | None = None, stream: str = "stdout") -> None:
    """In a command's own process: the package's messages as plain lines on ``stream`` ("stdout", or "stderr" where
    stdout carries a command's JSON), at ``process_log_level(args)``. Called again (once the arguments are parsed), it
    sets the level and the stream of the one handler."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    handler = next((handler for handler in logger.handlers if isinstance(handler, ConsoleLines)), None)
    if handler is None:
        logger.addHandler(handler := ConsoleLines())
    handler.stream = stream
    logger.propagate = False  # a root handler (another library's basicConfig) would show each line twice
    logger.setLevel(process_log_level(args))
