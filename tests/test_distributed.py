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


class WriteRecorder:
    """A stream that keeps each write apart: what another process writing into the same file could come between."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        if text:  # an empty write (tqdm's ``end=""``) writes nothing
            self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_print0_writes_its_lines_and_their_newline_at_once(monkeypatch):
    """Every rank and the launcher write into one log: rank 0's line written apart from its newline let another
    rank's text end up on it (a CI log where no line started with ``engine:``)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "stdout", stdout := WriteRecorder())
    distributed.print0("engine: FSDP2", "memory plan: 1 GiB")
    assert stdout.writes == ["engine: FSDP2\nmemory plan: 1 GiB\n"]


@pytest.fixture
def two_relays():
    """Rank 0's and rank 1's ErrorRelay on one real TCPStore, as a 2-rank launch has them."""
    from datetime import timedelta

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    relays = [distributed.ErrorRelay(), distributed.ErrorRelay()]
    for rank, relay in enumerate(relays):
        relay.attach(store, rank, 2)
    return relays


def test_rank_0_says_the_error_only_another_rank_hit(two_relays):
    """Rank 1's line reaches rank 0 through the store, rank 0 says it once, and rank 1, acknowledged, stays silent."""
    import threading

    rank0, rank1 = two_relays
    acknowledged = []
    publisher = threading.Thread(target=lambda: acknowledged.append(rank1.publish("saving X failed: disk full", 10.0)))
    publisher.start()
    while (message := rank0.peer_error()) is None:
        pass
    said = []
    assert rank0.say(message, said.append)
    rank0.wait_until_seen()
    publisher.join()
    assert said == ["saving X failed: disk full"] and acknowledged == [True]
    assert not rank0.say("a second error", said.append), "rank 0 says one error"
    assert said == ["saving X failed: disk full"]


def test_without_rank_0_the_other_rank_says_it_itself(two_relays):
    assert two_relays[1].publish("saving X failed: disk full", 0.3) is False  # nobody acknowledged it
    assert distributed.ErrorRelay().publish("no store attached", 0.3) is False


class _StoreGone:
    """The deepspeed launcher's store lives in rank 0's process: once rank 0 has left, every call fails."""

    def set(self, key, value):
        raise torch.distributed.DistNetworkError("Broken pipe")


def test_a_store_gone_with_rank_0_means_rank_0_has_left_after_its_own_line():
    relay = distributed.ErrorRelay()
    relay.attach(_StoreGone(), 1, 2)
    assert relay.publish("saving X failed: disk full", 5.0) is True  # silent: a second line would repeat rank 0's


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
