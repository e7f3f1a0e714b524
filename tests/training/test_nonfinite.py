"""A NaN training loss or gradient norm stops the run at its step, before its update, naming the samples and the
last checkpoint; with ``on_nonfinite="skip"`` the step is dropped (no update) and counted instead."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

import run_sft
from hf_lora_ds.errors import run_cli
from hf_lora_ds.training.nonfinite import NonFiniteGradientError, NonFiniteLossError, batch_sequences
from tests.trainer.test_lora_sft_trainer import RECORDS, make_trainer


class NaNEmbeddingsAtStep(TrainerCallback):
    """From step ``step`` on, the input embeddings output NaN: the loss is NaN while every weight stays finite, so
    the test can tell whether the bad step's update was applied."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs) -> None:
        if state.global_step + 1 == self.step:
            model.get_input_embeddings().register_forward_hook(lambda module, inputs, output: output * float("nan"))


class PoisonStep(TrainerCallback):
    """During step ``step`` only, poison the ``loss`` (the input embeddings output NaN) or one ``gradient`` (the first
    lora_B weight's gradient becomes NaN in the backward pass, the loss stays finite)."""

    def __init__(self, target: str, step: int) -> None:
        self.target, self.step, self.handle = target, step, None

    def on_step_begin(self, args, state, control, model=None, **kwargs) -> None:
        if state.global_step + 1 != self.step:
            return
        if self.target == "loss":
            nan_output = lambda module, inputs, output: output * float("nan")  # noqa: E731
            self.handle = model.get_input_embeddings().register_forward_hook(nan_output)
        else:
            lora_b = next(param for name, param in model.named_parameters() if "lora_B" in name)
            self.handle = lora_b.register_hook(lambda grad: grad * float("nan"))

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


class StateAfterEachStep(TrainerCallback):
    """The LoRA weights and the optimizer's moments at the end of every step (step 0: before training)."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.moments: dict[int, list[torch.Tensor]] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs) -> None:
        self.weights[0] = lora_weights(model)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs) -> None:
        self.weights[state.global_step] = lora_weights(model)
        self.moments[state.global_step] = [
            value.clone() for entry in optimizer.state_dict()["state"].values() for value in entry.values()
        ]


def lora_weights(model) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters() if param.requires_grad}


def test_batch_sequences_padded_and_padding_free():
    padded = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    assert batch_sequences(padded) == [(5, 6, 7), (8, 9)]
    flat = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "position_ids": torch.tensor([[0, 1, 2, 0, 1]])}
    assert batch_sequences(flat) == [(5, 6, 7), (8, 9)]
    packed = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 4, 3]]),
        "position_ids": torch.tensor([[0, 1, 2, 0], [0, 1, 0, 1]]),
    }
    assert batch_sequences(packed) == [(5, 6, 7), (0,), (8, 9), (4, 3)]  # the padding piece matches no sample


@pytest.mark.parametrize(
    "poison, error, first",
    [
        (lambda: NaNEmbeddingsAtStep(3), NonFiniteLossError, "non-finite training loss (nan) at step 3"),
        (
            lambda: PoisonStep("gradient", 3),
            NonFiniteGradientError,
            "non-finite gradient norm (nan) at step 3, before its update was applied",
        ),
    ],
    ids=["loss", "gradient_norm"],
)
def test_nan_stops_before_its_update(poison, error, first, tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_model,
        qwen_style_tokenizer,
        tmp_path,
        max_steps=5,
        save_strategy="steps",
        save_steps=1,
        train_sampling_strategy="sequential",
    )
    trainer.add_callback(poison())
    with pytest.raises(error) as raised:
        trainer.train()
    message = str(raised.value)
    # Sequential batches of 8: step 3 holds samples 16..23; record i of the list is "record i".
    assert first in message
    assert f"indices) {list(range(16, 24))}" in message and "(record 16; record 17;" in message
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert f"last complete checkpoint: {checkpoint}" in message
    assert not (tmp_path / "out" / "checkpoint-3").exists()
    # No NaN gradient was applied: the LoRA weights are still those saved after step 2.
    assert_weights_are_checkpoints(trainer.model, checkpoint)


def assert_weights_are_checkpoints(model, checkpoint: Path) -> None:
    saved = load_file(checkpoint / "adapter_model.safetensors")
    current = {name.replace(".default", ""): value for name, value in lora_weights(model).items()}
    assert len(saved) == len(current) > 0
    for name, value in saved.items():
        torch.testing.assert_close(current[f"base_model.model.{name.removeprefix('base_model.model.')}"], value)


@pytest.mark.parametrize("poisoned", ["loss", "gradient"])
def test_skip_mode_drops_the_step_and_counts_it(poisoned, tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_model,
        qwen_style_tokenizer,
        tmp_path,
        max_steps=4,
        on_nonfinite="skip",
        train_sampling_strategy="sequential",
    )
    trainer.add_callback(PoisonStep(poisoned, 2))
    after = StateAfterEachStep()
    trainer.add_callback(after)
    trainer.train()
    # Step 2 left the weights and the optimizer's moments exactly as step 1 did; the other steps trained.
    for name, value in after.weights[1].items():
        assert torch.equal(after.weights[2][name], value), name
    assert len(after.moments[2]) == len(after.moments[1]) > 0
    assert all(torch.equal(late, early) for late, early in zip(after.moments[2], after.moments[1]))
    for step in (1, 3, 4):
        assert any(not torch.equal(after.weights[step][n], after.weights[step - 1][n]) for n in after.weights[0])
    assert all(torch.isfinite(value).all() for value in after.weights[4].values())
    history = trainer.state.log_history
    assert {entry["step"]: entry["nonfinite_skipped"] for entry in history if "loss" in entry} == {
        1: 0,
        2: 1,
        3: 1,
        4: 1,
    }
    assert next(entry for entry in history if "train_loss" in entry)["nonfinite_skipped"] == 1
    # Trainer's NaN filter is on in skip mode: the dropped step's loss does not reach the logged one.
    assert all(math.isfinite(entry[key]) for entry in history for key in ("loss", "train_loss") if key in entry)


def test_run_sft_reports_it_as_one_line(tiny_model_dir, tmp_path, capsys):
    train = tmp_path / "train.json"
    train.write_text(json.dumps(RECORDS, ensure_ascii=False), encoding="utf-8")
    argv = [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--train_file",
        str(train),
        "--eval_file",
        "",
        "--output_dir",
        str(tmp_path / "out"),
        "--dataset_cache_dir",
        str(tmp_path / "cache"),
        "--max_steps",
        "4",
        "--per_device_train_batch_size",
        "8",
        "--train_sampling_strategy",
        "sequential",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--report_to",
        "none",
    ]
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: run_sft.main(argv, callbacks=[NaNEmbeddingsAtStep(2)]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    assert re.search(
        r"at step 2, .*indices\) \[8, 9, 10, 11, 12, 13, 14, 15\] \(.*train.json, line 1 \(record 8\)", errors[0]
    ), errors[0]
    assert "no complete checkpoint in" in errors[0]


@pytest.mark.parametrize("save_steps", [None, 3], ids=["logging_window", "checkpoint_ends_it"])
def test_a_longer_logging_window_stops_at_its_end_naming_the_bad_step(
    save_steps, tiny_model, qwen_style_tokenizer, tmp_path
):
    """The device is read once per logging window (here 4 steps): a NaN loss from step 2 on stops the run before the
    update of the window's last step, or of a checkpoint's step before it, so no checkpoint holds NaN weights; the
    message names step 2, its samples, and the updates that were applied in between."""
    saving = dict(save_strategy="steps", save_steps=save_steps) if save_steps else {}
    trainer = make_trainer(
        tiny_model,
        qwen_style_tokenizer,
        tmp_path,
        max_steps=8,
        logging_steps=4,
        train_sampling_strategy="sequential",
        **saving,
    )
    trainer.add_callback(NaNEmbeddingsAtStep(2))
    after = StateAfterEachStep()
    trainer.add_callback(after)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer.train()
    read_at = save_steps or 4
    message = str(raised.value)
    assert message.startswith(
        f"non-finite training loss (nan) at step 2, read at the end of its logging window, after the updates of "
        f"steps 2-{read_at - 1}; samples of the batch (training dataset indices) {list(range(8, 16))}"
    )
    assert max(after.weights) == read_at - 1  # the step that read the window never completed
    assert not list((tmp_path / "out").glob("checkpoint-*"))
