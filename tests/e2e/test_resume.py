"""Kill a run with SIGKILL while it writes a checkpoint, resume with ``--resume_from_checkpoint auto``: it must pick
the last *complete* checkpoint, run only the steps after it, and end exactly where an uninterrupted run with the same
seed ends.

The killed run is that uninterrupted run up to its kill: it dies inside the save of its last step, after Trainer wrote
the checkpoint's files (adapter and trainer state included) and before the completion marker. So the resumed run,
from the complete checkpoint before it, must end with that checkpoint's adapter and log its losses. A run with a fixed
seed that trained again from scratch would end with the same adapter too, so the adapter alone proves nothing: the
resumed launch must start at the checkpoint's step and complete exactly the remaining ones (``StepRecorder`` in
sft_entry.py), and its losses must be the killed run's, which needs the optimizer state restored as well as the
weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    once_per_key,
    printed_lines,
    recorded_steps,
    run,
    sft_args,
    trainer_state,
    variant_args,
    variant_logs,
)

STEPS = 4  # checkpoints at 2 and 4; the run dies inside the save of step 4
# Trainer's own checkpoints, a one-process DeepSpeed engine, and ZeRO partitioned over 2 ranks: optimizer state
# (stage 2; stage 1 is the same DeepSpeed optimizer and checkpoint layout), then parameters too with CPU Adam
# (stage3_offload: stage 3's checkpoint layout, which offload does not change, and the offloaded optimizer's state).
# Every shipped config is launched by tests/e2e/test_launch_matrix.py; the cases here are the distinct checkpoint
# paths. FSDP2 over 2 CPU ranks through the shipped Accelerate config: sharded checkpoint, adapter saved whole.
LAUNCHES = {
    ("python", 1): ["no-deepspeed", "stage0"],
    ("deepspeed", 2): ["stage2", "stage3_offload"],
    ("accelerate", 2): ["fsdp2"],
}
CASES = [(kind, nproc, config) for (kind, nproc), configs in LAUNCHES.items() for config in configs]


@dataclass
class KilledRun:
    """What the killed launch left, read before the resumed launch writes over it."""

    returncode: int
    log: str
    steps: dict
    last_checkpoint: str | None
    complete: dict[int, bool]
    marked: dict[int, bool]
    adapter: dict[str, torch.Tensor]  # checkpoint-4's, written before the kill: the uninterrupted run's at step 4
    losses: list[float]  # the losses of the steps after checkpoint-2, from checkpoint-4's trainer state


@pytest.fixture(scope="module")
def resumed_runs(tiny_model_dir, sum_data, tmp_path_factory):
    """``resumed_runs(kind, nproc)``: per launcher, one launch a configuration whose last rank dies inside the save of
    step 4, and one launch resuming them all (``sft_entry.py --variant``: one run a configuration, the ranks started
    once)."""
    root = tmp_path_factory.mktemp("resume")

    def launch(kind: str, nproc: int, out: Path, name: str, *extra: str, evaluated: bool = False):
        args = sft_args(tiny_model_dir, sum_data, out, *extra, eval_file=evaluated, steps=STEPS, save_steps=2)
        command = launcher(kind, nproc, "fsdp2" if kind == "accelerate" else None)
        return run(command + [str(ENTRY)] + args, root / f"{kind}-{name}.log")

    def engine(kind: str, config: str) -> str:
        if kind == "accelerate" or config == "no-deepspeed":
            return ""
        return f"--deepspeed {REPO / 'ds_configs' / f'{config}.json'}"

    def launch_all(kind: str, nproc: int) -> dict:
        variants = {config: engine(kind, config) for config in LAUNCHES[kind, nproc]}
        resumed = root / f"{kind}-resumed"
        killed = {}
        for config, flags in variants.items():
            out = resumed / config
            # The last rank dies inside the save of step 4: Trainer has written checkpoint-4, the completion marker not.
            launched = launch(
                kind,
                nproc,
                out,
                f"killed-{config}",
                *flags.split(),
                "--kill_rank",
                str(nproc - 1),
                "--kill_step",
                "4",
                "--kill_on",
                "save",
            )
            killed[config] = KilledRun(
                launched.returncode,
                launched.log,
                recorded_steps(out, nproc)[0],
                get_last_checkpoint(str(out)),
                {step: is_complete_checkpoint(out / f"checkpoint-{step}") for step in (2, 4)},
                {step: (out / f"checkpoint-{step}" / COMPLETE_MARKER).exists() for step in (2, 4)},
                adapter_weights(out / "checkpoint-4"),
                losses_after(out / "checkpoint-4", step=2),
            )
        # The resumed launch is the whole job: its accuracy before and after (the shipped FSDP2 config's, as a user
        # runs it).
        again = launch(
            kind,
            nproc,
            resumed,
            "resumed",
            "--resume_from_checkpoint",
            "auto",
            *variant_args(variants),
            evaluated=kind == "accelerate",
        )
        check_ok(again)
        return {"resumed": resumed, "killed": killed, "logs": variant_logs(again.log)}

    return once_per_key(launch_all)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "nproc", "config"), CASES, ids=[f"{k}-{n}-{c}" for k, n, c in CASES])
@pytest.mark.timeout(1800)  # the first case of a launcher waits for its 1 + configurations launches
def test_killed_during_a_save_then_resumed_matches_an_uninterrupted_run(
    kind, nproc, config, resumed_runs, tiny_model_dir
):
    runs = resumed_runs(kind, nproc)
    resumed, killed, log = runs["resumed"] / config, runs["killed"][config], runs["logs"][config]
    assert killed.returncode != 0, killed.log[-3000:]
    assert killed.steps == {"start": 0, "completed": [1, 2, 3, 4]}
    assert killed.complete[2] and not killed.marked[4]
    # transformers alone would resume from that unconfirmed one:
    assert killed.last_checkpoint == str(resumed / "checkpoint-4")

    if kind == "accelerate":
        check_whole_job(resumed, log, world_size=nproc)
    note = f"resume: from {resumed / 'checkpoint-2'} (latest complete checkpoint; skipped incomplete checkpoint-4)"
    assert log.count(note) == 1, log[-3000:]
    # Every rank starts at the checkpoint's step and runs only the steps after it.
    assert recorded_steps(resumed, nproc) == [{"start": 2, "completed": [3, 4]}] * nproc
    assert len(losses_logged_by(log)) == STEPS - 2, log[-3000:]

    assert trainer_state(resumed)["global_step"] == STEPS
    verify_adapter(resumed, base_model=tiny_model_dir)
    expected, got = killed.adapter, adapter_weights(resumed)
    assert expected.keys() == got.keys()
    # Bit-exact without offload (measured). With offload, DeepSpeed's CPU Adam keeps beta^t in float: multiplied step
    # by step in one run, recomputed with std::pow after a resume, which moves the last bits of the bias correction
    # (measured: 6.2e-6 at most on weights up to 0.26, losses equal to 5 digits).
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if "offload" in config else {"rtol": 1e-5, "atol": 1e-6}
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **tolerance, msg=name)
    # The same training run, not only the same end: identical losses at every step after the resume point.
    assert len(killed.losses) == STEPS - 2
    assert losses_after(resumed, step=2) == pytest.approx(killed.losses, rel=1e-5)


def losses_after(out: Path, step: int) -> list[float]:
    """The training losses ``out``'s trainer state logged after ``step``."""
    return [entry["loss"] for entry in trainer_state(out)["log_history"] if "loss" in entry and entry["step"] > step]


def losses_logged_by(log: str) -> list[str]:
    """The per-step training loss lines one launch printed (logging_steps 1): Trainer's ``{'loss': ...}`` dicts."""
    return printed_lines(log, "{'loss': ")
