"""World size agreement between the launcher, Trainer's data sharding and DeepSpeed, on CPU (and unchanged on GPU).

These pin the decision logic; tests/e2e launches run_sft.py under deepspeed, torchrun and plain python and checks
what every rank actually saw.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainingArguments

from hf_lora_ds import distributed

LAUNCH_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "RANK", "LOCAL_RANK")
LOCAL_SIZE_VARIABLES = ("LOCAL_SIZE", "LOCAL_WORLD_SIZE")


@pytest.fixture
def no_launcher(monkeypatch):
    """No launcher variables, and whatever the code under test sets is removed afterwards."""
    for name in (*LAUNCH_VARIABLES, *LOCAL_SIZE_VARIABLES, "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # records the original value (or its absence) for undo
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("environment", "expected"),
    [({}, 1), ({"WORLD_SIZE": "4"}, 4), ({"OMPI_COMM_WORLD_SIZE": "3"}, 3), ({"PMI_SIZE": "2"}, 2)],
)
def test_launcher_world_size(no_launcher, environment, expected):
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    assert distributed.launcher_world_size() == expected


@pytest.mark.parametrize(
    ("accelerator", "expected"), [(None, False), (torch.device("mps"), False), (torch.device("cuda"), True)]
)
def test_has_distributed_accelerator(monkeypatch, accelerator, expected):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: accelerator)
    assert distributed.has_distributed_accelerator() is expected


@pytest.mark.parametrize(
    ("use_cpu", "world_size", "accelerator", "expected"),
    [
        (False, "2", False, True),  # the bug case: several ranks, no GPU
        (False, "2", True, False),  # GPU ranks keep nccl: never forced onto the CPU
        (False, None, False, False),  # single process: no-op
        (True, "2", True, True),  # the user's explicit choice wins
    ],
)
def test_resolve_use_cpu(no_launcher, use_cpu, world_size, accelerator, expected):
    if world_size:
        no_launcher.setenv("WORLD_SIZE", world_size)
    no_launcher.setattr(distributed, "has_distributed_accelerator", lambda: accelerator)
    assert distributed.resolve_use_cpu(use_cpu) is expected


@pytest.mark.parametrize(
    ("environment", "expected"),
    [({"LOCAL_SIZE": "2"}, "2"), ({"LOCAL_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, "4"), ({}, None)],
)
def test_deepspeed_launchers_local_size_reaches_accelerate(no_launcher, environment, expected):
    """accelerate splits CPU threads by LOCAL_WORLD_SIZE; the deepspeed launcher only sets LOCAL_SIZE."""
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    distributed.name_local_world_size()
    assert os.environ.get("LOCAL_WORLD_SIZE") == expected


def test_single_process_deepspeed_gets_a_launcher_environment(no_launcher):
    distributed.prepare_distributed(SimpleNamespace(use_cpu=False, deepspeed="ds_configs/stage3.json"))
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("0", "0", "1")
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and int(os.environ["MASTER_PORT"]) > 0


def test_launched_or_plain_runs_keep_their_environment(no_launcher):
    distributed.prepare_distributed(SimpleNamespace(use_cpu=False, deepspeed=None))
    assert "RANK" not in os.environ  # without DeepSpeed a plain run stays a plain run
    no_launcher.setenv("WORLD_SIZE", "2")
    no_launcher.setenv("RANK", "1")
    distributed.emulate_single_process_launcher()
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"]) == ("2", "1")


def test_global_batch_and_description(tmp_path, no_launcher):
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=3, gradient_accumulation_steps=4, report_to="none"
    )
    assert distributed.effective_global_batch(args) == 3 * 4 * args.world_size
    assert f"global batch {3 * 4 * args.world_size} = 3 per device x 4 accumulation x" in distributed.describe_world(
        args
    )
    distributed.ensure_world_agreement(args)  # a single process agrees with itself


def test_disagreement_is_reported_with_the_fix(tmp_path, no_launcher):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    no_launcher.setenv("WORLD_SIZE", "2")  # as if a launcher had started 2 ranks but Trainer saw 1
    with pytest.raises(RuntimeError, match="launcher started 2 processes.*use_cpu"):
        distributed.check_world_size(args)


def test_deepspeed_shm_buffer_unlinked_once_mapped(tmp_path, monkeypatch):
    """DeepSpeed never unlinks its CPU allreduce buffers; we unlink this rank's after a barrier, and only a buffer
    this process has mapped (a stale one from an older job on the same port is not ours, and no barrier is held)."""
    import mmap

    barriers = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "barrier", lambda: barriers.append(1))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    own = tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29555_1"
    own.write_bytes(b"\0" * 4096)

    distributed.unlink_deepspeed_shm_buffers(str(tmp_path))  # exists but not mapped here: left alone
    assert own.exists() and not barriers

    with open(own, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as mapped:
        distributed.unlink_deepspeed_shm_buffers(str(tmp_path))
        assert not own.exists() and barriers == [1]
        mapped[0] = 7  # the mapping outlives the name
        assert mapped[0] == 7


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
