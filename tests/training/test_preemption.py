"""SIGTERM mid-training: the step finishes, a complete checkpoint is saved, exit code 75; ``auto`` continues from it
and the resumed run runs only the remaining steps and ends with the adapter of an uninterrupted run. Preemption is the
trainer's own (hf_lora_ds.training.preemption): it works with every callback of the package taken out."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainerControl

import run_sft
from hf_lora_ds.training.checkpoints import is_complete_checkpoint
from hf_lora_ds.training.preemption import PREEMPTED_EXIT_CODE, Preemption
from tests.trainer.test_final_adapter import _without_the_packages_callbacks
from tests.trainer.test_lora_sft_trainer import RECORDS, StepRecorder, make_trainer


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


def test_the_handlers_record_a_signal_and_go_back_however_the_block_ends():
    preemption, before = Preemption(), signal.getsignal(signal.SIGUSR1)
    with pytest.raises(RuntimeError), preemption.handling_signals():
        os.kill(os.getpid(), signal.SIGUSR1)
        raise RuntimeError("training failed")
    assert preemption.signal_received == signal.SIGUSR1 and signal.getsignal(signal.SIGUSR1) is before


def test_only_a_signal_asks_for_the_save_and_the_stop():
    preemption, control = Preemption(), TrainerControl()
    preemption.stop_if_signalled(control, torch.device("cpu"))
    assert not (preemption.preempted or control.should_save or control.should_training_stop)
    preemption.signal_received = signal.SIGTERM
    preemption.stop_if_signalled(control, torch.device("cpu"))
    assert preemption.preempted and control.should_save and control.should_training_stop


class _StepEndControl(TrainerCallback):
    """What a callback sees of the trainer's decisions at each step's end."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool, bool]] = []

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.seen.append((state.global_step, control.should_save, control.should_training_stop))


def test_the_trainer_stops_on_a_signal_with_none_of_the_packages_callbacks(tiny_model, qwen_style_tokenizer, tmp_path):
    """The test's own handler for SIGUSR1 around training: had the trainer none, the signal would land there and
    training would run on to step 4."""
    caught: list[int] = []

    def ours(number: int, frame) -> None:
        caught.append(number)

    previous = signal.signal(signal.SIGUSR1, ours)
    try:
        observer = _StepEndControl()
        callbacks = [SignalAtStep(2, signal.SIGUSR1), observer]
        trainer = make_trainer(
            tiny_model, qwen_style_tokenizer, tmp_path, callbacks=callbacks, run_callbacks="preemption"
        )
        _without_the_packages_callbacks(trainer)
        trainer.train()
        after = signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert caught == [] and after is ours  # the trainer's handler took the signal; the one before it is back
    assert trainer.preempted and trainer.preemption.signal_received == signal.SIGUSR1
    assert observer.seen == [(1, False, False), (2, True, True)]  # decided before on_step_end: every callback sees it
    out = tmp_path / "out"
    assert (out / "checkpoint-2").is_dir() and not (out / "adapter_model.safetensors").exists()
