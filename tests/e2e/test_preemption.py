"""SIGTERM to every rank of a 2-rank ZeRO-3 run: each finishes the step, one complete checkpoint is written, the job
exits 75; ``--resume_from_checkpoint auto`` runs only the remaining steps and ends where an uninterrupted run ends.
The uninterrupted run and the preempted one share a launch (sft_entry.py --variant, the preempted run last)."""

from __future__ import annotations

import re

import pytest
import torch

from hf_lora_ds.training.checkpoints import is_complete_checkpoint
from hf_lora_ds.training.preemption import PREEMPTED_EXIT_CODE
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_ok,
    launcher,
    run,
    sft_args,
    trainer_state,
    variant_args,
)

STEPS = 4


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_sigterm_to_every_rank_then_resume_matches_an_uninterrupted_run(tiny_model_dir, sum_data, tmp_path):
    def launch(out, name, *extra):
        args = sft_args(
            tiny_model_dir,
            sum_data,
            out,
            "--max_steps",
            str(STEPS),
            "--lora_dropout",
            "0",
            "--deepspeed",
            str(REPO / "ds_configs" / "stage3.json"),
            *extra,
            eval_file=False,
        )
        return run(launcher("deepspeed", 2) + [str(ENTRY)] + args, tmp_path / f"{name}.log")

    both = {"uninterrupted": "", "preempted": "--sigterm_step 2"}
    preempted = launch(tmp_path, "preempted", *variant_args(both))
    assert preempted.returncode == PREEMPTED_EXIT_CODE, preempted.log[-3000:]
    reference, out = tmp_path / "uninterrupted", tmp_path / "preempted"
    assert (reference / "adapter_model.safetensors").is_file()
    assert is_complete_checkpoint(out / "checkpoint-2") and not (out / "checkpoint-3").exists()

    resumed = launch(out, "resumed", "--resume_from_checkpoint", "auto")
    check_ok(resumed)
    assert f"resume: from {out / 'checkpoint-2'}" in resumed.log
    # Only the remaining steps ran: one loss line per step (--logging_steps 1), for steps 3 and 4.
    assert len(re.findall(r"\{'loss': ", resumed.log)) == STEPS - 2, resumed.log[-3000:]
    assert trainer_state(out)["global_step"] == trainer_state(reference)["global_step"] == STEPS
    expected, got = adapter_weights(reference), adapter_weights(out)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
