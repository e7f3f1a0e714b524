"""hf_lora_ds.cli.log: a command's process shows the package's messages as plain lines on stdout, rank 0 at info,
the other ranks at warning, or as --log_level/--log_level_replica say; without it (a library user's process) nothing
is set."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
from tqdm import tqdm

from hf_lora_ds.cli import log

# A module's logger, as the package's modules get theirs (transformers.utils.logging.get_logger(__name__)).
MODULE_LOGGER = logging.getLogger("hf_lora_ds.trainer.run_inputs")


@pytest.mark.parametrize(
    ("rank", "flags", "level"),
    [
        ("0", {}, logging.INFO),  # "passive", Trainer's default: info on rank 0, so a run says what it always said
        ("1", {}, logging.WARNING),  # and the other ranks stay quiet
        ("0", {"log_level": "error", "log_level_replica": "debug"}, logging.ERROR),
        ("1", {"log_level": "error", "log_level_replica": "debug"}, logging.DEBUG),
        ("1", {"log_level": "debug", "log_level_replica": "passive"}, logging.WARNING),
    ],
)
def test_the_level_is_log_level_on_rank_0_and_log_level_replica_elsewhere(no_launcher, rank, flags, level):
    no_launcher.setenv("RANK", rank)  # before the process group exists, the launcher's RANK says which rank this is
    args = SimpleNamespace(**{"log_level": "passive", "log_level_replica": "passive", **flags})
    assert log.process_log_level(args) == level
    assert log.process_log_level() == (logging.INFO if rank == "0" else logging.WARNING)  # no arguments yet


@pytest.mark.parametrize(("rank", "shown"), [("0", "one\ntwo\nthree\n"), ("1", "three\n")])
def test_a_command_shows_rank_0s_lines_plainly_on_stdout_and_the_others_warnings(no_launcher, capsys, rank, shown):
    no_launcher.setenv("RANK", rank)
    log.configure_logging()
    MODULE_LOGGER.info("one\ntwo")
    MODULE_LOGGER.warning("three")
    assert capsys.readouterr() == (shown, "")


def test_configured_again_it_keeps_one_handler_and_takes_the_new_level_and_stream(no_launcher, capsys):
    log.configure_logging()
    log.configure_logging(SimpleNamespace(log_level="warning", log_level_replica="passive"), stream="stderr")
    MODULE_LOGGER.info("hidden")
    MODULE_LOGGER.warning("shown")
    assert capsys.readouterr() == ("", "shown\n")
    assert sum(isinstance(h, log.ConsoleLines) for h in logging.getLogger("hf_lora_ds").handlers) == 1


def test_a_root_handler_does_not_show_a_command_s_lines_twice(
    no_launcher: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command's process where another library called ``logging.basicConfig`` (a handler on the root logger, here
    writing to the same stdout): each of the package's lines shows once, through the package's own handler."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stdout)  # pytest's captured stdout, as basicConfig's stream would be
    handler.setFormatter(logging.Formatter("root: %(message)s"))
    root.addHandler(handler)
    try:
        log.configure_logging()
        MODULE_LOGGER.info("engine: FSDP2")
    finally:
        root.removeHandler(handler)
    assert capsys.readouterr().out == "engine: FSDP2\n"


def test_a_library_process_that_configures_nothing_gets_no_info_line_on_stdout(capsys, caplog):
    """What a user building the trainer in code gets: the records reach standard logging (here pytest's handler on
    the root logger), nothing is written to stdout."""
    caplog.set_level(logging.INFO, logger="hf_lora_ds")
    MODULE_LOGGER.info("data: 4 samples")
    assert capsys.readouterr().out == ""
    assert caplog.messages == ["data: 4 samples"]


class WriteRecorder:
    """A stream that keeps each write apart: what another process writing into the same file could come between."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.flushed: list[str] = []  # the writes made when each flush came

    def write(self, text: str) -> int:
        if text:  # an empty write (tqdm's ``end=""``) writes nothing
            self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushed.append("".join(self.writes))


def test_a_line_is_written_to_the_stdout_of_the_moment_at_once_with_its_newline(no_launcher, monkeypatch):
    """Every rank and the launcher write into one log: rank 0's line written apart from its newline let another
    rank's text end up on it (a CI log where no line started with ``engine:``). The stream is looked up at each line:
    set after the handler (pytest's capture, a redirect), it still gets the line."""
    log.configure_logging()
    monkeypatch.setattr(sys, "stdout", stdout := WriteRecorder())
    MODULE_LOGGER.info("engine: FSDP2\nmemory plan: 1 GiB")
    assert stdout.writes == ["engine: FSDP2\nmemory plan: 1 GiB\n"]
    assert stdout.flushed[-1:] == ["engine: FSDP2\nmemory plan: 1 GiB\n"]  # flushed, not left in a pipe's buffer


def test_a_line_lifts_a_live_progress_bar_off_its_line(no_launcher, capsys):
    """A line logged while Trainer's bar is drawn gets its own line: the bar is cleared first and redrawn after."""
    log.configure_logging()
    bar = tqdm(total=3, file=sys.stderr, ascii=True)
    bar.update(1)
    capsys.readouterr()
    MODULE_LOGGER.info("CPU Memory before entering the eval : 681.8")
    captured = capsys.readouterr()
    bar.close()
    assert captured.out == "CPU Memory before entering the eval : 681.8\n"
    assert "\r" in captured.err and "1/3" in captured.err  # cleared, then redrawn below the line
