"""One rank SIGKILLed mid-training: the whole job must exit non-zero within a minute, never hang.

The mechanism is the launchers' and gloo's, not ours: the survivor's next collective fails at once with
"Connection reset by peer" (the kernel closes the dead rank's sockets), and both the deepspeed launcher (polls its
children every second, kills the rest on a non-zero exit) and torchrun's agent (stops the worker group on the first
failure, ``--max_restarts 0`` by default) then exit non-zero. Across two torchrun nodes no launcher sees both
ranks: the surviving node's rank fails on its own through gloo, and its agent exits. (NCCL on GPUs may notice a
dead peer only at the collective timeout, ``--ddp_timeout``, 30 min by default; untested here.)
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.launching import ENTRY, REPO, launcher, run, run_two_nodes, sft_args

MAX_SECONDS_AFTER_KILL = 60
# Each launch's limit catches a job nobody ended (a hang: 200 steps), below the test's 600 s.
HANG_S = 300


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["deepspeed", "torchrun"])
def test_a_dead_rank_ends_the_job(kind, tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    extra = ["--max_steps", "200", "--kill_rank", "1", "--kill_step", "2"]  # 200 steps: minutes if nobody noticed
    if kind == "deepspeed":
        extra += ["--deepspeed", str(REPO / "ds_configs" / "stage3.json")]
    launch = run(
        launcher(kind, 2) + [str(ENTRY)] + sft_args(tiny_model_dir, sum_data, out, *extra, eval_file=False),
        tmp_path / "launch.log",
        timeout=HANG_S,
    )
    killed = json.loads((out / "e2e_killed.json").read_text())
    assert launch.returncode != 0, launch.log[-3000:]
    assert launch.finished_at - killed["time"] < MAX_SECONDS_AFTER_KILL, launch.log[-3000:]
    assert not (out / "adapter_model.safetensors").exists(), "the surviving rank finished training alone"
    print(f"{kind}: exit {launch.returncode} {launch.finished_at - killed['time']:.1f} s after the kill")


@pytest.mark.slow
def test_a_dead_rank_ends_a_two_node_torchrun_job(tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    extra = ["--max_steps", "200", "--kill_rank", "1", "--kill_step", "2"]
    nodes = run_two_nodes(
        "torchrun",
        [str(ENTRY), *sft_args(tiny_model_dir, sum_data, out, *extra, eval_file=False)],
        tmp_path,
        timeout=HANG_S,
    )
    killed = json.loads((out / "e2e_killed.json").read_text())
    for node in nodes:
        assert node.returncode != 0, node.log[-3000:]
    assert max(node.finished_at for node in nodes) - killed["time"] < MAX_SECONDS_AFTER_KILL
    print(
        f"2 torchrun nodes: exits {[node.returncode for node in nodes]}, "
        f"{max(node.finished_at for node in nodes) - killed['time']:.1f} s after the kill"
    )
