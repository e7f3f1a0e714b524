"""transformers' training progress bar, started once the run's setup lines are printed instead of before them.

Trainer starts its bar in ``on_train_begin``, and its progress callback runs ahead of every callback a trainer is
given, so what those print at train begin (the ``engine:`` line, the model load's memory) landed on the bar's own
line, after ``0%|``, in a terminal and in every log file. This bar is made when the first epoch begins, after every
callback's ``on_train_begin`` has run and before any step is taken; everything else is transformers' own. A trainer
keeps Trainer's bar unless asked: ``bar_after_setup_lines(trainer)`` swaps it (the command line does).
"""

from __future__ import annotations

from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ProgressCallback

__all__ = ["SetupFirstProgressCallback", "bar_after_setup_lines"]


class SetupFirstProgressCallback(ProgressCallback):
    """``ProgressCallback`` whose bar appears at the first ``on_epoch_begin`` rather than at ``on_train_begin``."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._bar_started = False

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if not self._bar_started:
            self._bar_started = True
            super().on_train_begin(args, state, control, **kwargs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.training_bar is not None:  # a resumed run with no step left never starts an epoch
            super().on_train_end(args, state, control, **kwargs)


def bar_after_setup_lines(trainer: Trainer) -> None:
    """Replace ``trainer``'s terminal progress bar, in its place, with one that starts after the setup lines."""
    handler = trainer.callback_handler.callbacks
    for index, callback in enumerate(handler):
        if type(callback) is ProgressCallback:  # the terminal's: a notebook's bar and --disable_tqdm's printer stay
            handler[index] = SetupFirstProgressCallback(callback.max_str_len)
