"""Ranks and the process group as the package sees them (hf_lora_ds.distributed); the launch itself is
tests/launch/test_world.py's."""

from __future__ import annotations

import sys

import pytest
import torch
from tqdm import tqdm

from hf_lora_ds import distributed


@pytest.mark.parametrize(
    ("environment", "expected"),
    [({}, 1), ({"WORLD_SIZE": "4"}, 4), ({"OMPI_COMM_WORLD_SIZE": "3"}, 3), ({"PMI_SIZE": "2"}, 2)],
)
def test_launcher_world_size(no_launcher, environment, expected):
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    assert distributed.launcher_world_size() == expected


def test_process_group_released_at_the_end(tmp_path):
    """A gloo group alive at interpreter exit can abort a finished rank (SIGABRT, "terminate called without an
    active exception"): run_sft and the eval CLI end with release_process_group, which must leave none behind."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        distributed.release_process_group()
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    distributed.release_process_group()  # and without a group: nothing to do, no error


def test_a_launched_rank_exits_without_interpreter_teardown(monkeypatch):
    """Teardown can run C++ thread destructors of gloo/DeepSpeed that abort a finished rank; a single process exits
    normally (so in-process callers still see SystemExit)."""
    import hf_lora_ds.distributed as distributed

    class LeftAtOnce(Exception):
        pass

    def fake_exit(code):
        raise LeftAtOnce(code)

    monkeypatch.setattr(distributed.os, "_exit", fake_exit)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as normal:
        distributed.exit_launched_rank(3)
    assert normal.value.code == 3
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LeftAtOnce) as immediate:
        distributed.exit_launched_rank(0)
    assert immediate.value.args == (0,)


@pytest.mark.parametrize(("rank", "shown"), [("0", "one\ntwo\n"), ("1", "")])
def test_print0_talks_on_global_rank_0_only(monkeypatch, capsys, rank, shown):
    monkeypatch.setenv("RANK", rank)  # before the process group exists, the launcher's RANK says which rank this is
    distributed.print0("one", "two")
    assert capsys.readouterr().out == shown


def test_print0_lifts_a_live_progress_bar_off_its_line(monkeypatch, capsys):
    """A line printed while Trainer's bar is drawn gets its own line: the bar is cleared first and redrawn after."""
    monkeypatch.setenv("RANK", "0")
    bar = tqdm(total=3, file=sys.stderr, ascii=True)
    bar.update(1)
    capsys.readouterr()
    distributed.print0("CPU Memory before entering the eval : 681.8")
    captured = capsys.readouterr()
    bar.close()
    assert captured.out == "CPU Memory before entering the eval : 681.8\n"
    assert "\r" in captured.err and "1/3" in captured.err  # cleared, then redrawn below the line
