"""World size agreement between the launcher, Trainer's data sharding and DeepSpeed, on CPU (and unchanged on GPU).

These pin the decision logic; tests/e2e launches run_sft.py under deepspeed, torchrun and plain python and checks
what every rank actually saw."""

from __future__ import annotations

import importlib
import os
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainingArguments

from hf_lora_ds.distributed import launcher_world_size, process_group_exists
from hf_lora_ds.launch import world


@pytest.mark.parametrize(
    ("accelerator", "expected"), [(None, False), (torch.device("mps"), False), (torch.device("cuda"), True)]
)
def test_has_distributed_accelerator(accelerator_seen, accelerator, expected):
    accelerator_seen(accelerator)
    assert world.has_distributed_accelerator() is expected


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
    no_launcher.setattr(world, "has_distributed_accelerator", lambda: accelerator)
    assert world.resolve_use_cpu(use_cpu) is expected


@pytest.mark.parametrize(
    ("environment", "expected"),
    [({"LOCAL_SIZE": "2"}, "2"), ({"LOCAL_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, "4"), ({}, None)],
)
def test_deepspeed_launchers_local_size_reaches_accelerate(no_launcher, environment, expected):
    """accelerate splits CPU threads by LOCAL_WORLD_SIZE; the deepspeed launcher only sets LOCAL_SIZE."""
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    world.name_local_world_size()
    assert os.environ.get("LOCAL_WORLD_SIZE") == expected


def test_single_process_deepspeed_gets_a_launcher_environment(no_launcher):
    world.prepare_distributed(SimpleNamespace(use_cpu=False, deepspeed="ds_configs/stage3.json"))
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("0", "0", "1")
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and int(os.environ["MASTER_PORT"]) > 0


def test_launched_or_plain_runs_keep_their_environment(no_launcher):
    world.prepare_distributed(SimpleNamespace(use_cpu=False, deepspeed=None))
    assert "RANK" not in os.environ  # without DeepSpeed a plain run stays a plain run
    no_launcher.setenv("WORLD_SIZE", "2")
    no_launcher.setenv("RANK", "1")
    world.emulate_single_process_launcher()
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"]) == ("2", "1")


def test_a_single_process_agrees_with_itself(tmp_path, no_launcher):
    """One process and no launcher: Trainer, the launcher and torch.distributed all see a world of one, and the
    check that compares them passes, creating no process group and exporting no launcher variable; the same check,
    once a launcher says 2, names the three sizes it compared."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    environment = dict(os.environ)
    world.ensure_world_agreement(args)
    assert args.world_size == launcher_world_size() == 1
    assert not process_group_exists() and dict(os.environ) == environment
    no_launcher.setenv("WORLD_SIZE", "2")  # a second rank this process never saw: the check did run above
    with pytest.raises(
        RuntimeError, match="launcher started 2 processes, torch.distributed has 1, TrainingArguments sees 1"
    ):
        world.ensure_world_agreement(args)


@pytest.mark.parametrize(
    ("config", "group", "world_size", "shared"),
    [
        ("ds_configs/stage3.json", True, 1, True),  # a world of one: not left to zero.Init
        ("ds_configs/stage3.json", True, 2, True),
        ("ds_configs/stage3.json", False, 1, False),  # no process group to share
        (None, True, 2, False),  # no DeepSpeed
    ],
)
def test_deepspeed_comm_gets_the_process_group_made_without_the_shared_memory_op(
    monkeypatch, config, group, world_size, shared
):
    """A world of one too: zero.Init would make DeepSpeed's communication as the model loads, building the op."""
    import deepspeed.comm

    backend = importlib.import_module("deepspeed.comm.torch")
    initialised = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: group)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *group: world_size)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *group: "gloo")
    monkeypatch.setattr(deepspeed.comm, "is_initialized", lambda: False)
    monkeypatch.setattr(backend, "build_shm_op", lambda: "the op")
    monkeypatch.setattr(
        deepspeed.comm, "init_distributed", lambda **options: initialised.append(backend.build_shm_op())
    )
    args = SimpleNamespace(deepspeed=config, ddp_timeout_delta=None)
    world.share_process_group_with_deepspeed(args)
    assert initialised == ([None] if shared else [])
    assert backend.build_shm_op() == "the op"


def test_disagreement_is_reported_with_the_fix(tmp_path, no_launcher):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    no_launcher.setenv("WORLD_SIZE", "2")  # as if a launcher had started 2 ranks but Trainer saw 1
    with pytest.raises(RuntimeError, match="launcher started 2 processes.*use_cpu"):
        world.check_world_size(args)


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

    world.unlink_deepspeed_shm_buffers(str(tmp_path))  # exists but not mapped here: left alone
    assert own.exists() and not barriers

    with open(own, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as mapped:
        world.unlink_deepspeed_shm_buffers(str(tmp_path))
        assert not own.exists() and barriers == [1]
        mapped[0] = 7  # the mapping outlives the name
        assert mapped[0] == 7
