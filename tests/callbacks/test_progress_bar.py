"""The training bar starts after what the callbacks print at train begin, so those lines never land on its line."""

from __future__ import annotations

import sys

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ProgressCallback

from hf_lora_ds.callbacks.progress_bar import SetupFirstProgressCallback, bar_after_setup_lines


class SetupLine(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        print("engine: plain", file=sys.stderr, flush=True)  # on the bar's stream, so the order shows in one capture


def test_setup_lines_come_before_the_bar(make_trainer, capfd):
    trainer = make_trainer(disable_tqdm=False, max_steps=2)
    trainer.add_callback(SetupLine())  # after the bar, as every callback a trainer is given
    bar_after_setup_lines(trainer)
    assert not any(type(cb) is ProgressCallback for cb in trainer.callback_handler.callbacks)
    trainer.train()
    err = capfd.readouterr().err
    assert "engine: plain\n" in err and err.index("engine: plain") < err.index("%|")
    assert "2/2" in err  # and the bar still counts the steps


def test_the_bar_appears_at_the_first_epoch_and_closes_at_the_end():
    bar = SetupFirstProgressCallback()
    args, control = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none"), TrainerControl()
    state = TrainerState(max_steps=4, is_world_process_zero=True)
    bar.on_train_begin(args, state, control)
    assert bar.training_bar is None
    bar.on_epoch_begin(args, state, control)
    first = bar.training_bar
    assert first is not None and first.total == 4
    bar.on_epoch_begin(args, state, control)
    assert bar.training_bar is first  # one bar for the run, not one per epoch
    bar.on_train_end(args, state, control)
    assert bar.training_bar is None


def test_a_run_with_no_step_left_ends_without_a_bar():
    bar = SetupFirstProgressCallback()
    args, control = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none"), TrainerControl()
    state = TrainerState(max_steps=4, is_world_process_zero=True)
    bar.on_train_begin(args, state, control)
    bar.on_train_end(args, state, control)
    assert bar.training_bar is None
