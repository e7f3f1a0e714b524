"""SIGTERM mid-training: the step finishes, a complete checkpoint is saved, exit code 75; ``auto`` continues from it
and the resumed run runs only the remaining steps and ends with the adapter of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

import run_sft
from hf_lora_ds.callbacks.preemption import PREEMPTED_EXIT_CODE
from hf_lora_ds.training.checkpoints import is_complete_checkpoint
from tests.trainer.test_lora_sft_trainer import RECORDS, StepRecorder


class SignalAtStep(TrainerCallback):
    """Send this process ``signum`` as step ``step`` begins, as a cluster's scheduler would mid-step."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum = step, signum

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.fixture(scope="module")
def sft_argv(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("preemption")
    train = root / "train.json"
    train.write_text(json.dumps(RECORDS, ensure_ascii=False), encoding="utf-8")

    def argv(out: Path, *extra: str) -> list[str]:
        return [
            "--model_name_or_path",
            str(tiny_model_dir),
            "--train_file",
            str(train),
            "--eval_file",
            "",
            "--output_dir",
            str(out),
            "--dataset_cache_dir",
            str(root / "cache"),
            "--max_steps",
            "4",
            "--per_device_train_batch_size",
            "8",
            "--learning_rate",
            "1e-2",
            "--save_strategy",
            "no",
            "--logging_steps",
            "1",
            "--lora_dropout",
            "0",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            *extra,
        ]

    return argv


@pytest.fixture(scope="module")
def uninterrupted(sft_argv, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The adapter an uninterrupted run ends with: one run, which every signal's resumed run must equal."""
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    run_sft.main(sft_argv(out))
    return load_file(out / "adapter_model.safetensors")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_signal_saves_a_complete_checkpoint_and_auto_resumes(sft_argv, uninterrupted, tmp_path, signum):
    out = tmp_path / "preempted"
    with pytest.raises(SystemExit) as exited:
        run_sft.main(sft_argv(out), callbacks=[SignalAtStep(2, signum)])
    assert exited.value.code == PREEMPTED_EXIT_CODE == 75
    assert signal.getsignal(signum) is signal.SIG_DFL, "the handler must not outlive training"
    assert is_complete_checkpoint(out / "checkpoint-2") and not (out / "checkpoint-3").exists()
    assert not (out / "adapter_model.safetensors").exists(), "a preempted run must not look finished"

    recorder = StepRecorder()
    run_sft.main(sft_argv(out, "--resume_from_checkpoint", "auto"), callbacks=[recorder])
    assert recorder.steps == [3, 4], "the resumed run must take only the remaining steps"
    expected, got = uninterrupted, load_file(out / "adapter_model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(
            got[name], expected[name], rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )


class FailAtStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs) -> None:
        raise RuntimeError("a run that fails mid-training")


def test_a_run_that_raises_leaves_no_signal_handler_behind(sft_argv, tmp_path):
    """Trainer skips on_train_end when training raises; the handlers must still go back, or a later SIGTERM to
    this process (a notebook, the next test) would be recorded and ignored."""
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGUSR1)}
    with pytest.raises(RuntimeError, match="fails mid-training"):
        run_sft.main(sft_argv(tmp_path / "failed"), callbacks=[FailAtStep()])
    assert {number: signal.getsignal(number) for number in before} == before
