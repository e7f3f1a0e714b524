"""Launch run_sft.py (through ``sft_entry.py``) under deepspeed, torchrun or plain python, and read what it left.

Every launch gets its own free ``--master_port``, ``OMP_NUM_THREADS=1`` (tiny models gain nothing from threads, and
on a busy 2-core runner ranks waiting on each other's threads slow down many-fold) and no inherited launcher
variables, so a test run under some launcher still starts clean children.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from safetensors.torch import load_file

from hf_lora_ds.model.adapter_check import verify_adapter

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(__file__).with_name("sft_entry.py")
VARIANT_MARKER = "[e2e] variant "  # rank 0's line before each run of an ``sft_entry.py --variant`` launch
RUN_SFT = REPO / "run_sft.py"
CONFIGS = sorted(path.stem for path in (REPO / "ds_configs").glob("*.json"))
LAUNCH_TIMEOUT_S = 600
SFT_STEPS, SFT_PER_DEVICE = 4, 4  # sft_args' short run
_INHERITED_LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RUN_ID",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_SIZE",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_env() -> dict[str, str]:
    """This environment (tests/conftest.py put this interpreter's bin first on its PATH) without launcher
    variables."""
    env = {key: value for key, value in os.environ.items() if key not in _INHERITED_LAUNCH_VARIABLES}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def launcher(kind: str, nproc: int = 1, accelerate_config: str | Path | None = None) -> list[str]:
    """The command a user types: ``deepspeed --num_gpus N``, ``torchrun --nproc_per_node N``, ``accelerate launch
    --config_file C`` (a shipped config's name, or a path) or ``python``, each as ``python -m`` of the module its
    console script calls, so this interpreter's environment is the one tested."""
    port = str(free_port())
    if kind == "accelerate":
        config = Path(accelerate_config)
        config = config if config.suffix else REPO / "accelerate_configs" / f"{config}.yaml"
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config),
            "--num_processes",
            str(nproc),
            "--main_process_port",
            port,
        ]
    if kind == "deepspeed":
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc), "--master_port", port]
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", port]
    if kind == "python":
        assert nproc == 1, "plain python runs one process"
        return [sys.executable]
    raise ValueError(f"unknown launcher {kind}")


def sft_args(
    model_dir: Path,
    data: dict[str, Path],
    out: Path,
    *extra: str,
    eval_file: bool = True,
    steps: int = SFT_STEPS,
    save_steps: int | None = None,
) -> list[str]:
    """A short run: 4 steps of 4 samples per rank at a learning rate that lowers the loss within those steps; with
    ``save_steps``, a checkpoint every that many steps."""
    return [
        "--model_name_or_path",
        str(model_dir),
        "--train_file",
        str(data["train"]),
        "--eval_file",
        str(data["eval"]) if eval_file else "",
        "--output_dir",
        str(out),
        "--dataset_cache_dir",
        str(out.parent / "dataset-cache"),
        "--max_steps",
        str(steps),
        "--per_device_train_batch_size",
        str(SFT_PER_DEVICE),
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "2e-2",
        "--lr_scheduler_type",
        "constant",
        "--warmup_steps",
        "0",
        "--logging_steps",
        "1",
        *(["--save_strategy", "steps", "--save_steps", str(save_steps)] if save_steps else ["--save_strategy", "no"]),
        "--seed",
        "0",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        *extra,
    ]


@dataclass
class Launch:
    returncode: int
    log: str
    seconds: float
    finished_at: float


def start(command: list[str], log) -> subprocess.Popen:
    """The launcher in a session of its own: a timed-out test kills its ranks with it (killing the launcher alone
    leaves them running, and a rank killed inside DeepSpeed's op build leaves the build's lock for the next test)."""
    return subprocess.Popen(
        command, cwd=REPO, env=launch_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_or_kill(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    except BaseException:  # the timeout, or the test interrupted
        kill_group(process)
        raise


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the launcher's session (its ranks outlive a launcher that died first)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run(command: list[str], log_path: Path, timeout: int = LAUNCH_TIMEOUT_S) -> Launch:
    begin = time.perf_counter()
    with open(log_path, "w") as log:
        returncode = wait_or_kill(start(command, log), timeout)
    return Launch(returncode, log_path.read_text(errors="replace"), time.perf_counter() - begin, time.time())


Launched = TypeVar("Launched")


def once_per_key(launch: Callable[..., Launched]) -> Callable[..., Launched]:
    """``launch(*key)`` run by the first test that asks for ``key`` and shared with the others; a failed launch (an
    assertion, a timeout: any exception, pytest's own failures included) fails every test of it without being
    launched again. Only an interrupt (Ctrl-C) is not kept."""
    done: dict[tuple, Launched | BaseException] = {}

    def get(*key) -> Launched:
        if key not in done:
            try:
                done[key] = launch(*key)
            except (Exception, pytest.fail.Exception) as failure:
                done[key] = failure
        if isinstance(done[key], BaseException):
            raise done[key]
        return done[key]

    return get


def node_launcher(kind: str, node_rank: int, port: int, log_dir: Path) -> list[str]:
    """One of two one-rank "nodes" on 127.0.0.1. torchrun: ``--nnodes 2 --node_rank R``. deepspeed: a two-host
    hostfile and ``--no_ssh --node_rank R`` (the launcher started on each machine, as torchrun is; its default
    instead reaches the hosts over SSH, which a test cannot)."""
    master = ["--master_addr", "127.0.0.1", "--master_port", str(port), "--node_rank", str(node_rank)]
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", *master]
    hostfile = log_dir / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")  # two names for loopback: two "machines"
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_ssh", *master]


def run_two_nodes(kind: str, args: list[str], log_dir: Path, timeout: int = LAUNCH_TIMEOUT_S) -> list[Launch]:
    """Start both nodes at once and wait for both; one ``Launch`` per node, ``finished_at`` when both are done."""
    port = free_port()
    begin, logs, nodes = time.perf_counter(), [], []
    try:
        for node_rank in (0, 1):
            logs.append(open(log_dir / f"node{node_rank}.log", "w"))
            nodes.append(start(node_launcher(kind, node_rank, port, log_dir) + args, logs[-1]))
        deadline = time.monotonic() + timeout
        codes = [wait_or_kill(node, max(deadline - time.monotonic(), 0)) for node in nodes]
    finally:
        for node, log in zip(nodes, logs):
            if node.poll() is None:
                kill_group(node)
            log.close()
    seconds, now = time.perf_counter() - begin, time.time()
    return [
        Launch(code, (log_dir / f"node{rank}.log").read_text(errors="replace"), seconds, now)
        for rank, code in enumerate(codes)
    ]


def variant_args(variants: dict[str, str]) -> list[str]:
    """``sft_entry.py --variant NAME:ARGS`` for each run of one launch."""
    return [option for name, extra in variants.items() for option in ("--variant", f"{name}:{extra}")]


def variant_logs(log: str) -> dict[str, str]:
    """Each variant's part of a ``--variant`` launch's log, from rank 0's ``[e2e] variant NAME`` line to the next (the
    lines rank 0 prints for that run; another rank's lines near a boundary may fall on either side)."""
    parts = re.split(rf"^{re.escape(VARIANT_MARKER)}(\S+)$", log, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def check_ok(launch: Launch) -> None:
    assert launch.returncode == 0, f"exit {launch.returncode} after {launch.seconds:.0f} s:\n{launch.log[-6000:]}"


def trainer_state(out: Path) -> dict:
    return json.loads((out / "trainer_state.json").read_text())


def losses(out: Path) -> list[float]:
    return [entry["loss"] for entry in trainer_state(out)["log_history"] if "loss" in entry]


def printed_lines(log: str, prefix: str) -> list[str]:
    """Each line of a multi-process ``log`` that starts with ``prefix``, read from the prefix on: every rank and the
    launcher write into one file, so another process's unfinished line (its text, then its newline in a second write)
    may stand before rank 0's line, which ``^prefix`` would then miss."""
    return re.findall(rf"{re.escape(prefix)}.*$", log, flags=re.MULTILINE)


def world_lines(log: str) -> list[str]:
    """run_sft's ``describe_world`` line (rank 0 prints it once; the engine line's "world size 2, ..." is not it)."""
    return [line for line in printed_lines(log, "world size ") if " (launcher " in line]


def rank_samples(out: Path, world_size: int) -> list[list[tuple[int, ...]]]:
    return [
        [tuple(ids) for ids in json.loads((out / f"e2e_samples_rank{rank}.json").read_text())]
        for rank in range(world_size)
    ]


def recorded_steps(out: Path, world_size: int) -> list[dict]:
    """Per rank, what ``StepRecorder`` saw in the latest launch: ``{"start": step, "completed": [steps]}``."""
    return [json.loads((out / f"e2e_steps_rank{rank}.json").read_text()) for rank in range(world_size)]


def check_process_groups_released(out: Path, world_size: int) -> None:
    """Every rank of an ``sft_entry.py`` run left main with its process group destroyed (a gloo group alive at exit
    can abort the rank in interpreter teardown and fail a finished job)."""
    for rank, exit_state in enumerate(_exit_states(out, world_size)):
        assert exit_state["process_group_alive"] is False, f"rank {rank}: {exit_state}"


def check_compiler_not_imported(out: Path, world_size: int) -> None:
    """No rank of an ``sft_entry.py`` launch imported torch's compiler (nothing it ran compiles: hf_lora_ds._compat)."""
    for rank, exit_state in enumerate(_exit_states(out, world_size)):
        assert exit_state["compiler_imported"] is False, f"rank {rank}: {exit_state}"


def _exit_states(out: Path, world_size: int) -> list[dict]:
    """What each rank of an ``sft_entry.py`` launch wrote as it left main (``e2e_exit_rank{R}.json``)."""
    return [json.loads((out / f"e2e_exit_rank{rank}.json").read_text()) for rank in range(world_size)]


def eval_report(out: Path) -> dict:
    return json.loads((out / "eval_report.json").read_text())


def adapter_weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "adapter_model.safetensors"))


def check_run(
    out, log: str, model_dir, world_size: int, evaluated: bool = True, generation_weights: str | None = None
) -> None:
    state = trainer_state(out)
    assert state["global_step"] == SFT_STEPS
    loss = losses(out)
    assert len(loss) == SFT_STEPS and loss[-1] < loss[0], f"loss did not decrease: {loss}"
    verify_adapter(out, base_model=model_dir)
    check_every_lora_b_trained(out)

    (line,) = world_lines(log)  # printed once, by rank 0
    assert line.startswith(f"world size {world_size} (launcher {world_size}), rank 0,")
    batch = SFT_PER_DEVICE * world_size
    assert f"global batch {batch} = {SFT_PER_DEVICE} per device x 1 accumulation x {world_size} ranks" in line

    if evaluated:
        check_whole_job(out, log, world_size, generation_weights=generation_weights)


def check_whole_job(
    out: Path, log: str, world_size: int, num_samples: int = 6, generation_weights: str | None = None
) -> None:
    """The job's end a user sees: the before/after accuracy table printed once (rank 0), eval_report.json with both
    phases over the whole eval set on every rank (with ``generation_weights``, how generation held the weights), and
    report.html with its before/after accuracy plot."""
    (header,) = printed_lines(log, "eval task: ")
    assert header == "eval task: sum_to_x", header
    table = log[log.index(header) :].splitlines()
    assert table[1].split() == ["before", "after"], table[:3]
    assert table[2].split()[0] == "accuracy" and len(table[2].split()) == 3, table[:3]
    report = eval_report(out)
    assert set(report) == {"before", "after"}
    assert all(
        report[phase]["num_samples"] == num_samples and report[phase]["world_size"] == world_size for phase in report
    )
    assert table[2].split()[1:] == [f"{report[phase]['accuracy']:.3f}" for phase in ("before", "after")], table[2]
    if generation_weights is not None:
        assert [report[phase]["generation_weights"] for phase in report] == [generation_weights] * 2, report
    assert 'alt="accuracy before and after"' in (out / "report.html").read_text(encoding="utf-8")


def predicted_outputs(out: Path, phase: str) -> list[str]:
    """The completions a run's ``phase`` eval (``before``/``after``) generated, in record order."""
    lines = (out / f"predictions_{phase}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["output"] for line in lines]


def check_in_run_eval(out: Path, steps: list[int]) -> None:
    """``--eval_strategy steps``: Trainer's eval loss and the accuracy callback's accuracy at each of ``steps``."""
    history = trainer_state(out)["log_history"]
    assert [entry["step"] for entry in history if "eval_loss" in entry] == steps, history
    accuracy = [entry for entry in history if "eval_accuracy" in entry and entry["step"] in steps]
    assert [entry["step"] for entry in accuracy] == steps, history
    assert all(0 <= entry["eval_accuracy"] <= 1 for entry in accuracy)


def check_every_lora_b_trained(out) -> None:
    """verify_adapter accepts a well-formed adapter that never trained; LoRA's B starts at zero, so a trained one has
    every lora_B non-zero and finite (each module got gradient through its own B)."""
    b_factors = {name: t for name, t in adapter_weights(out).items() if ".lora_B." in name}
    assert b_factors, "no lora_B tensors saved"
    untrained = sorted(name for name, tensor in b_factors.items() if not tensor.any())
    assert not untrained, f"lora_B still all zero after training: {untrained[:3]}"


def master_port(command: list[str]) -> str | None:
    """The rendezvous port a launcher command names; None for ``python`` (the package then picks a free one)."""
    for flag in ("--master_port", "--main_process_port"):
        if flag in command:
            return command[command.index(flag) + 1]
    return None


def deepspeed_shm_buffers(master_port: str) -> set[str]:
    """Names of DeepSpeed's CPU allreduce buffers in /dev/shm (~69 MB of RAM each while they exist) of the launch on
    ``master_port``: the name holds the port, so launches running beside it (pytest-xdist) are not counted."""
    shm = Path("/dev/shm")
    return {path.name for path in shm.glob(f"deepspeed_allreduce_buffer_*_{master_port}_*")} if shm.is_dir() else set()


def check_own_samples(out, world_size: int, num_records: int) -> None:
    """Every rank's training loader holds a disjoint share of the data, and together they hold all of it."""
    per_rank = rank_samples(out, world_size)
    shares = [set(samples) for samples in per_rank]
    assert all(len(share) == len(samples) == num_records // world_size for share, samples in zip(shares, per_rank))
    assert len(set().union(*shares)) == num_records, "ranks were given the same samples"
