"""``--on_nonfinite`` under DeepSpeed with 2 ranks, where the optimizer step happens inside the engine's backward
call: a NaN gradient on one rank only must drop the step on both (DeepSpeed's overflow check, seen through Trainer's
gradient norm as ``inf``), be counted once, and leave the adapter exactly as the step before left it; in stop mode
the same NaN stops both ranks at that step with the same message."""

from __future__ import annotations

import re

import pytest
import torch

from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    launcher,
    printed_lines,
    run,
    sft_args,
    trainer_state,
    variant_args,
    variant_logs,
)


@pytest.fixture(scope="module")
def nan_launch(tiny_model_dir, sum_data, tmp_path_factory):
    """One launch, two runs (sft_entry.py --variant): ``skip``, then ``stop``, which ends the launch at its step 2."""
    root = tmp_path_factory.mktemp("nonfinite")
    variants = {"skip": "--on_nonfinite skip --save_strategy steps --save_steps 1", "stop": ""}
    args = sft_args(
        tiny_model_dir,
        sum_data,
        root,
        "--deepspeed",
        str(REPO / "ds_configs" / "stage2.json"),
        "--max_steps",
        "3",
        "--nan_grad_rank",
        "1",
        "--nan_grad_step",
        "2",
        eval_file=False,
    )
    launch = run(launcher("deepspeed", 2) + [str(ENTRY), *variant_args(variants)] + args, root / "launch.log")
    return root, launch, variant_logs(launch.log)


@pytest.mark.slow
def test_zero2_skips_a_step_with_a_nan_gradient_on_one_rank(nan_launch):
    out, launch, logs = nan_launch
    out = out / "skip"
    assert set(logs) == {"skip", "stop"}, launch.log[-3000:]  # the skip run ended; the stop run began
    history = trainer_state(out)["log_history"]
    assert {entry["step"]: entry["nonfinite_skipped"] for entry in history if "loss" in entry} == {1: 0, 2: 1, 3: 1}
    weights = {step: adapter_weights(out / f"checkpoint-{step}") for step in (1, 2, 3)}
    assert all(torch.equal(weights[2][name], value) for name, value in weights[1].items())
    assert any(not torch.equal(weights[3][name], value) for name, value in weights[2].items())
    assert all(torch.isfinite(value).all() for value in weights[3].values())


@pytest.mark.slow
def test_zero2_stops_at_a_nan_gradient_on_one_rank(nan_launch):
    _, launch, logs = nan_launch
    assert launch.returncode != 0, launch.log[-3000:]
    # Both ranks stop at step 2 (neither hangs in the next collective); behind run_sft's error boundary the message
    # is one line, naming the 4 samples of each rank's batch.
    errors = [line.removeprefix("error: ") for line in printed_lines(logs["stop"], "error: ")]
    assert len(errors) == 1, launch.log[-3000:]
    assert errors[0].startswith("non-finite gradient norm (inf) at step 2, before its update was applied")
    assert not re.search(r"^\[rank\d\]: Traceback", launch.log, flags=re.MULTILINE)
    indices = re.search(r"training dataset indices\) \[([\d, ]+)\]", errors[0]).group(1).split(", ")
    assert len(indices) == 8
