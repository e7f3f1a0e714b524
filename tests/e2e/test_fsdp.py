"""FSDP2 through Trainer's own flags (``torchrun --nproc_per_node 2 run_sft.py --fsdp full_shard --fsdp_config
fsdp_configs/fsdp2.json``) on 2 CPU ranks with gloo, where accelerate alone would silently train plain DDP.

One launch shows: the engine line read from the sharded model; the supervised-position loss of the sharded model
equal to DDP's on the same batches; the non-finite guard dropping a step whose gradient is NaN on one rank only (the
norm of FSDP2's sharded gradients is a DTensor) on both ranks; the memory trace per rank; the adapter saved whole.
The Accelerate FSDP2 config (a kill inside a save, exact resume) is test_resume.py's; both state dict types, efficient
loading and resume from each, test_fsdp_matrix.py's."""

from __future__ import annotations

import json

import pytest
import torch

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_ok,
    check_whole_job,
    launcher,
    losses,
    predicted_outputs,
    printed_lines,
    run,
    sft_args,
    trainer_state,
)


def _launch(tiny_model_dir, sum_data, out, log, *extra, evaluated: bool = False):
    args = sft_args(
        tiny_model_dir,
        sum_data,
        out,
        "--max_steps",
        "3",
        "--nan_grad_rank",
        "1",
        "--nan_grad_step",
        "2",
        "--on_nonfinite",
        "skip",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        *extra,
        eval_file=evaluated,
    )
    return run(launcher("torchrun", 2) + [str(ENTRY)] + args, log)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_fsdp2_trains_like_ddp_and_skips_a_nan_step_on_every_rank(tiny_model_dir, sum_data, tmp_path):
    fsdp_flags = ["--fsdp", "full_shard", "--fsdp_config", str(REPO / "fsdp_configs" / "fsdp2.json")]
    sharded = _launch(tiny_model_dir, sum_data, tmp_path / "fsdp", tmp_path / "fsdp.log", *fsdp_flags, evaluated=True)
    check_ok(sharded)
    check_whole_job(tmp_path / "fsdp", sharded.log, world_size=2)
    (line,) = printed_lines(sharded.log, "engine: ")
    assert line.startswith("engine: FSDP2 (full shard of "), line
    assert line.endswith("world size 2, backend gloo, weights float32, mixed precision no"), line
    assert "supervised-position logits: off" not in sharded.log
    (plan,) = printed_lines(sharded.log, "memory plan: ")
    assert plan.startswith("memory plan: fsdp_configs/fsdp2.json"), plan

    replicated = _launch(tiny_model_dir, sum_data, tmp_path / "ddp", tmp_path / "ddp.log", evaluated=True)
    check_ok(replicated)
    for phase in ("before", "after"):  # the sharded model answers as the replicated one does
        assert predicted_outputs(tmp_path / "fsdp", phase) == predicted_outputs(tmp_path / "ddp", phase), phase
    assert "engine: DDP, world size 2" in replicated.log
    # The same loss before the NaN step's update; after it both skipped, and go on from the same weights.
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "ddp"), rel=1e-5)

    out = tmp_path / "fsdp"
    history = trainer_state(out)["log_history"]
    assert {entry["step"]: entry["nonfinite_skipped"] for entry in history if "loss" in entry} == {1: 0, 2: 1, 3: 1}
    weights = {step: adapter_weights(out / f"checkpoint-{step}") for step in (1, 2, 3)}
    assert all(torch.equal(weights[2][name], value) for name, value in weights[1].items())
    assert any(not torch.equal(weights[3][name], value) for name, value in weights[2].items())
    verify_adapter(out, base_model=tiny_model_dir)

    trace = json.loads((out / "memory_trace.json").read_text())
    train = [phase for phase in trace if phase["phase"] == "train"]
    assert train and [rank["rank"] for rank in train[-1]["ranks"]] == [0, 1]
