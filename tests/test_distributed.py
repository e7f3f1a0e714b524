"""World size agreement between the launcher, Trainer's data sharding and DeepSpeed, on CPU (and unchanged on GPU).

Unit tests pin the decision logic; the slow tests launch ``tests/scripts/lora_probe.py`` (stock Trainer + PEFT)
under deepspeed, torchrun and plain python and check what every rank actually saw.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainingArguments

from hf_lora_ds import distributed
from hf_lora_ds.adapter import verify_adapter

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "scripts" / "lora_probe.py"
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


# --- launches -------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(command: list[str], out: Path, timeout: int = 600) -> None:
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as stream:
        result = subprocess.run(command, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n" + log.read_text()[-4000:]


def _probe_args(model_dir, out: Path, max_steps: int = 4) -> list[str]:
    return [
        "--model_dir", str(model_dir), "--output_dir", str(out), "--max_steps", str(max_steps),
        "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--logging_steps", "1",
        "--save_strategy", "no", "--report_to", "none", "--seed", "0",
    ]  # fmt: skip


def _check_ranks(out: Path, model_dir, world_size: int, wrapper: str, max_steps: int = 4) -> list[dict]:
    records = [json.loads((out / f"probe_rank{rank}.json").read_text()) for rank in range(world_size)]
    for record in records:
        assert record["trainer_world_size"] == record["dist_world_size"] == world_size
        if wrapper == "DeepSpeedEngine":
            assert record["deepspeed_world_size"] == world_size
        assert record["wrapper"] == wrapper
        assert record["global_batch"] == 2 * world_size
        assert record["global_step"] == max_steps
        assert record["losses"][-1] < record["losses"][0], record["losses"]
    seen = [set(record["seen"]) for record in records]
    assert sum(len(ids) for ids in seen) == len(set().union(*seen)), "ranks trained on the same samples"
    # >= max_steps batches each: accelerate's loader fetches one batch ahead of the training loop.
    assert all(len(record["seen"]) >= 2 * max_steps for record in records)
    verify_adapter(out, base_model=model_dir)
    return records


@pytest.fixture(scope="module")
def stage3_all_partitioned(tmp_path_factory) -> Path:
    """stage3.json with every parameter partitioned: with the "auto" persistence threshold (10 x hidden) the tiny
    model's norm weights would stay whole, and the PEFT + ZeRO-3 + checkpointing recompute bug could not show."""
    config = json.loads((REPO / "ds_configs" / "stage3.json").read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path_factory.mktemp("ds") / "stage3_all_partitioned.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.slow
def test_deepspeed_zero3_two_ranks_with_activation_checkpointing(tiny_model_dir, tmp_path, stage3_all_partitioned):
    out = tmp_path / "zero3"
    launcher = ["deepspeed", "--num_gpus", "2", "--master_port", str(_free_port()), str(PROBE)]
    _run(launcher + _probe_args(tiny_model_dir, out) + ["--deepspeed", str(stage3_all_partitioned),
                                                         "--activation_checkpointing"], out)  # fmt: skip
    records = _check_ranks(out, tiny_model_dir, world_size=2, wrapper="DeepSpeedEngine")
    assert all(record["activation_checkpointing"] for record in records)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["stage2_offload.json"])
def test_deepspeed_two_ranks(tiny_model_dir, tmp_path, config):
    out = tmp_path / config.removesuffix(".json")
    launcher = ["deepspeed", "--num_gpus", "2", "--master_port", str(_free_port()), str(PROBE)]
    _run(launcher + _probe_args(tiny_model_dir, out) + ["--deepspeed", str(REPO / "ds_configs" / config)], out)
    _check_ranks(out, tiny_model_dir, world_size=2, wrapper="DeepSpeedEngine")


@pytest.mark.slow
def test_torchrun_two_ranks_shards_the_data(tiny_model_dir, tmp_path):
    out = tmp_path / "ddp"
    launcher = ["torchrun", "--nproc_per_node", "2", "--master_port", str(_free_port()), str(PROBE)]
    _run(launcher + _probe_args(tiny_model_dir, out), out)
    _check_ranks(out, tiny_model_dir, world_size=2, wrapper="DistributedDataParallel")


@pytest.mark.slow
def test_plain_python_with_deepspeed_config(tiny_model_dir, tmp_path):
    out = tmp_path / "single"
    env_free = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES}
    command = [sys.executable, str(PROBE), *_probe_args(tiny_model_dir, out, max_steps=3)]
    command += ["--deepspeed", str(REPO / "ds_configs" / "stage3.json")]
    log = tmp_path / "single.log"
    with open(log, "w") as stream:
        result = subprocess.run(command, cwd=REPO, env=env_free, stdout=stream, stderr=subprocess.STDOUT, timeout=600)
    assert result.returncode == 0, log.read_text()[-4000:]
    _check_ranks(out, tiny_model_dir, world_size=1, wrapper="DeepSpeedEngine", max_steps=3)
