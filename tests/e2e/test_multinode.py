"""Two "nodes" on loopback, one rank each: what a two-machine job does, under torchrun (``--nnodes 2 --node_rank
0|1``), under the deepspeed launcher started on each node (a two-host hostfile, ``--no_ssh --node_rank 0|1``), and
under the deepspeed launcher as docs/launchers.md's multi-node job starts it: once, with a hostfile, reaching both hosts
over SSH with pdsh (an sshd of the test's own on a loopback port: tests/e2e/loopback_ssh.py)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.e2e.launching import (
    ENTRY,
    REPO,
    check_ok,
    check_own_samples,
    check_process_groups_released,
    check_run,
    free_port,
    run,
    run_two_nodes,
    sft_args,
)
from tests.e2e.loopback_ssh import HOSTS, loopback_sshd


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["torchrun", "deepspeed"])
def test_two_nodes_on_loopback(kind, tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    # The generation eval is checked across the torchrun nodes only; under ZeRO-3 here it would double the time.
    evaluated = kind == "torchrun"
    extra = [] if evaluated else ["--deepspeed", str(REPO / "ds_configs" / "stage3.json")]
    args = sft_args(tiny_model_dir, sum_data, out, *extra, eval_file=evaluated)
    nodes = run_two_nodes(kind, [str(ENTRY), *args], tmp_path)
    for node in nodes:
        check_ok(node)
    print(f"{kind}, 2 nodes x 1 rank: {nodes[0].seconds:.1f} s")
    check_run(out, nodes[0].log, tiny_model_dir, world_size=2, evaluated=evaluated)
    assert "world size" not in nodes[1].log, "only global rank 0 prints"
    check_process_groups_released(out, 2)
    check_own_samples(out, 2, num_records=len(json.loads(sum_data["train"].read_text())))


@pytest.mark.slow
def test_hostfile_over_ssh(tiny_model_dir, sum_data, tmp_path, monkeypatch):
    """``deepspeed --hostfile`` with two hosts of one slot each, ZeRO-2: the launcher checks that node1 answers over
    ssh and starts one rank per host with pdsh; every connection goes to 127.0.0.1."""
    out = tmp_path / "out"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in HOSTS))
    # What the ranks' shells need beyond sshd's environment; DeepSpeed exports a DS_ENV_FILE's lines to every host.
    # TORCH_EXTENSIONS_DIR too where it is set (.ci/run sets one per checkout): the ranks load the ops the session
    # fixture built, where the default cache holds another checkout's build, which ninja would rebuild (~1 min).
    env_file = tmp_path / "deepspeed_env"
    extensions = (
        f"TORCH_EXTENSIONS_DIR={os.environ['TORCH_EXTENSIONS_DIR']}\n" if "TORCH_EXTENSIONS_DIR" in os.environ else ""
    )
    env_file.write_text(
        f"OMP_NUM_THREADS=1\nTOKENIZERS_PARALLELISM=false\nPATH={Path(sys.executable).parent}"
        f"{os.pathsep}{os.environ.get('PATH', '')}\n{extensions}"
    )
    args = sft_args(
        tiny_model_dir, sum_data, out, "--deepspeed", str(REPO / "ds_configs" / "stage2.json"), eval_file=False
    )
    empty = args.index("--eval_file")
    args[empty : empty + 2] = ["--eval_file="]  # pdsh hands the command to a remote shell: "" would vanish there
    command = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--hostfile",
        str(hostfile),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(ENTRY),
        *args,
    ]
    with loopback_sshd(tmp_path / "ssh") as ssh_env:
        for name, value in {**ssh_env, "DS_ENV_FILE": str(env_file)}.items():
            monkeypatch.setenv(name, value)  # run() starts the launcher with this process's environment
        launch = run(command, tmp_path / "launch.log")
    check_ok(launch)
    print(f"deepspeed --hostfile over ssh, 2 hosts x 1 rank: {launch.seconds:.1f} s")
    assert "node1: " in launch.log and "node2: " in launch.log  # pdsh prefixes each host's output with its name
    log = re.sub(r"^node[12]: ", "", launch.log, flags=re.MULTILINE)
    check_run(out, log, tiny_model_dir, world_size=2, evaluated=False)
    assert "engine: DeepSpeed ZeRO-2" in log
    check_process_groups_released(out, 2)
