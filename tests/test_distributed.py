"""Ranks and the process group as the package sees them (hf_lora_ds.distributed); the launch itself is
tests/launch/test_world.py's."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainingArguments

from hf_lora_ds import distributed


@pytest.mark.parametrize(
    ("environment", "expected"),
    [({}, 1), ({"WORLD_SIZE": "4"}, 4), ({"OMPI_COMM_WORLD_SIZE": "3"}, 3), ({"PMI_SIZE": "2"}, 2)],
)
def test_launcher_world_size(no_launcher, environment, expected):
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    assert distributed.launcher_world_size() == expected


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"WORLD_SIZE": "4"}, 4),  # one machine
        ({"WORLD_SIZE": "4", "LOCAL_SIZE": "2"}, 2),  # the DeepSpeed launcher's name
        ({"WORLD_SIZE": "4", "LOCAL_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}, 1),  # torchrun's and accelerate's first
    ],
)
def test_launcher_ranks_per_node(no_launcher, environment, expected):
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    assert distributed.launcher_ranks_per_node() == expected


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


# The waits below catch a hang, not slowness: each of these tests takes 0.1-0.3 s here, its waits end in ms.
HANG_S = 60.0


def relays_on_one_store(world_size: int, store=None) -> list[distributed.ErrorRelay]:
    """Every rank's ErrorRelay on one real TCPStore (a new one unless given), as a launch has them."""
    if store is None:
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=HANG_S))
    relays = [distributed.ErrorRelay() for _ in range(world_size)]
    for rank, relay in enumerate(relays):
        relay.attach(store, rank, world_size)
    return relays


@pytest.fixture
def two_relays():
    return relays_on_one_store(2)


def publishing(relay: distributed.ErrorRelay, message: str, acknowledged: list) -> threading.Thread:
    """``relay.publish(message)`` in a thread of its own, as the failed rank does while rank 0 reads it."""
    thread = threading.Thread(target=lambda: acknowledged.append(relay.publish(message, HANG_S)), daemon=True)
    thread.start()
    return thread


def peer_error_within(relay: distributed.ErrorRelay, seconds: float = HANG_S) -> str:
    """The error rank 0 reads, polled as its watcher thread polls it; the test fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (message := relay.peer_error()) is None:
        assert time.monotonic() < deadline, f"rank 0 read no error within {seconds} s"
        time.sleep(0.01)
    return message


def test_rank_0_says_the_error_only_another_rank_hit(two_relays):
    """Rank 1's line reaches rank 0 through the store, rank 0 says it once, and rank 1, acknowledged, stays silent."""
    rank0, rank1 = two_relays
    acknowledged = []
    publisher = publishing(rank1, "saving X failed: disk full", acknowledged)
    said = []
    assert rank0.say(peer_error_within(rank0), said.append)
    rank0.wait_until_seen()
    publisher.join(timeout=HANG_S)
    assert said == ["saving X failed: disk full"] and acknowledged == [True]
    assert not rank0.say("a second error", said.append), "rank 0 says one error"
    assert said == ["saving X failed: disk full"]


def test_rank_0_leaves_as_soon_as_the_failed_rank_read_the_acknowledgement(two_relays):
    """The failed rank says it has seen rank 0's acknowledgement: rank 0 need not wait out ``SEEN_WAIT_S`` (a rank
    that never fails never says so) before it exits, which would end the failed rank before it read it."""
    rank0, rank1 = two_relays
    rank0.SEEN_WAIT_S = HANG_S  # waited out, the test would take it whole: a minute, against ms
    acknowledged = []
    publisher = publishing(rank1, "saving X failed: disk full", acknowledged)
    rank0.say(peer_error_within(rank0), lambda message: None)
    start = time.monotonic()
    rank0.wait_until_seen()
    publisher.join(timeout=HANG_S)
    assert acknowledged == [True]
    assert time.monotonic() - start < rank0.SEEN_WAIT_S / 2


def test_rank_0_reads_the_error_of_every_other_rank():
    """The last rank's error too (on 3 ranks: rank 2)."""
    rank0, _rank1, rank2 = relays_on_one_store(3)
    acknowledged = []
    publisher = publishing(rank2, "rank 2's disk is full", acknowledged)
    said = []
    assert rank0.say(peer_error_within(rank0), said.append)
    publisher.join(timeout=HANG_S)
    assert said == ["rank 2's disk is full"] and acknowledged == [True]


def test_an_error_of_the_attempt_before_a_restart_is_not_read_again(monkeypatch):
    """torchrun's agent keeps its store when it restarts the workers: rank 0 of the next attempt must not read (and
    quit on) the error a rank published in the attempt before."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = relays_on_one_store(2, store)
    assert first[1].publish("saving X failed: disk full", 0.2) is False  # nobody acknowledged it
    assert first[0].peer_error() == "saving X failed: disk full"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert relays_on_one_store(2, store)[0].peer_error() is None


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


def test_global_batch_and_description(tmp_path, no_launcher):
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=3, gradient_accumulation_steps=4, report_to="none"
    )
    assert distributed.effective_global_batch(args) == 3 * 4 * args.world_size
    assert f"global batch {3 * 4 * args.world_size} = 3 per device x 4 accumulation x" in distributed.describe_world(
        args
    )


def test_sequence_parallel_ranks_share_a_batch(monkeypatch):
    """4 ranks in groups of 2 train 2 batches a micro-step: the global batch counts each group once."""
    args = SimpleNamespace(
        per_device_train_batch_size=3,
        gradient_accumulation_steps=4,
        world_size=4,
        process_index=0,
        device="cpu",
        distributed_state=SimpleNamespace(backend="gloo"),
    )
    monkeypatch.setattr(distributed, "launcher_world_size", lambda: 4)
    assert distributed.effective_global_batch(args, sequence_parallel=2) == 3 * 4 * 2
    assert distributed.describe_world(args, sequence_parallel=2).endswith(
        "global batch 24 = 3 per device x 4 accumulation x 2 data-parallel groups (of 2 sequence-parallel ranks)"
    )
