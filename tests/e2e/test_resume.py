"""Kill a run with SIGKILL while it writes a checkpoint, resume with ``--resume_from_checkpoint auto``: it must pick
the last *complete* checkpoint, run only the steps after it, and end exactly where an uninterrupted run with the same
seed ends.

A run with a fixed seed that trained again from scratch would end with the same adapter too, so the adapter alone
proves nothing: the resumed launch must start at the checkpoint's step and complete exactly the remaining ones
(``StepRecorder`` in sft_entry.py), and its losses after the resume point must be the uninterrupted run's, which
needs the optimizer state restored as well as the weights."""

from __future__ import annotations

import pytest
import torch
from transformers.trainer_utils import get_last_checkpoint

from hf_lora_ds.model.adapter_check import verify_adapter
from hf_lora_ds.training.checkpoints import COMPLETE_MARKER, is_complete_checkpoint
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_ok,
    check_whole_job,
    launcher,
    printed_lines,
    recorded_steps,
    run,
    sft_args,
    trainer_state,
)

STEPS = 6
# Trainer's own checkpoints, a one-process DeepSpeed engine, and ZeRO partitioned over 2 ranks: optimizer state
# (stage 2; stage 1 is the same DeepSpeed optimizer and checkpoint layout), then parameters too with CPU Adam
# (stage3_offload: stage 3's checkpoint layout, which offload does not change, and the offloaded optimizer's state).
# Every shipped config is launched by tests/e2e/test_launch_matrix.py; resume here costs 3 launches a case, so the
# cases are the distinct checkpoint paths.
CASES = [("python", 1, None), ("python", 1, "stage0")]
CASES += [("deepspeed", 2, config) for config in ("stage2", "stage3_offload")]
# FSDP2 over 2 CPU ranks through the shipped Accelerate config: sharded checkpoint, adapter saved whole.
CASES += [("accelerate", 2, "fsdp2")]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "nproc", "config"), CASES, ids=[f"{k}-{n}-{c or 'no-deepspeed'}" for k, n, c in CASES])
@pytest.mark.timeout(1800)  # three launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_killed_during_a_save_then_resumed_matches_an_uninterrupted_run(
    kind, nproc, config, tiny_model_dir, sum_data, tmp_path
):
    def launch(out, name, *extra, evaluated: bool = False):
        common = ["--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps", "2"]
        if config and kind != "accelerate":
            common += ["--deepspeed", str(REPO / "ds_configs" / f"{config}.json")]
        args = sft_args(tiny_model_dir, sum_data, out, *common, *extra, eval_file=evaluated)
        command = launcher(kind, nproc, config if kind == "accelerate" else None)
        return run(command + [str(ENTRY)] + args, tmp_path / f"{name}.log")

    reference = tmp_path / "uninterrupted"
    check_ok(launch(reference, "uninterrupted"))

    # The last rank dies inside the save of step 4: Trainer has written checkpoint-4, the completion marker is not.
    resumed = tmp_path / "resumed"
    killed = launch(resumed, "killed", "--kill_rank", str(nproc - 1), "--kill_step", "4", "--kill_on", "save")
    assert killed.returncode != 0, killed.log[-3000:]
    assert recorded_steps(resumed, nproc)[0] == {"start": 0, "completed": [1, 2, 3, 4]}
    assert is_complete_checkpoint(resumed / "checkpoint-2")
    assert not (resumed / "checkpoint-4" / COMPLETE_MARKER).exists()
    # transformers alone would resume from that unconfirmed one:
    assert get_last_checkpoint(str(resumed)) == str(resumed / "checkpoint-4")

    # The resumed launch is the whole job: its accuracy before and after (the shipped FSDP2 config's, as a user runs it).
    again = launch(resumed, "resumed", "--resume_from_checkpoint", "auto", evaluated=kind == "accelerate")
    check_ok(again)
    if kind == "accelerate":
        check_whole_job(resumed, again.log, world_size=nproc)
    note = f"resume: from {resumed / 'checkpoint-2'} (latest complete checkpoint; skipped incomplete checkpoint-4)"
    assert again.log.count(note) == 1, again.log[-3000:]
    # Every rank starts at the checkpoint's step and runs only the steps after it.
    assert recorded_steps(resumed, nproc) == [{"start": 2, "completed": [3, 4, 5, 6]}] * nproc
    assert len(losses_logged_by(again.log)) == STEPS - 2, again.log[-3000:]

    assert trainer_state(resumed)["global_step"] == trainer_state(reference)["global_step"] == STEPS
    verify_adapter(resumed, base_model=tiny_model_dir)
    expected, got = adapter_weights(reference), adapter_weights(resumed)
    assert expected.keys() == got.keys()
    # Bit-exact without offload (measured). With offload, DeepSpeed's CPU Adam keeps beta^t in float: multiplied step
    # by step in one run, recomputed with std::pow after a resume, which moves the last bits of the bias correction
    # (measured: 6.2e-6 at most on weights up to 0.26, losses equal to 5 digits).
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if config and "offload" in config else {"rtol": 1e-5, "atol": 1e-6}
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **tolerance, msg=name)
    # The same training run, not only the same end: identical losses at every step after the resume point.
    logged = [[entry["loss"] for entry in trainer_state(out)["log_history"] if "loss" in entry and entry["step"] > 2]
              for out in (reference, resumed)]  # fmt: skip
    assert len(logged[0]) == STEPS - 2
    assert logged[0] == pytest.approx(logged[1], rel=1e-5)


def losses_logged_by(log: str) -> list[str]:
    """The per-step training loss lines one launch printed (logging_steps 1): Trainer's ``{'loss': ...}`` dicts."""
    return printed_lines(log, "{'loss': ")
