"""The highest learning rate any optimizer step used: what the final adapter check compares a still adapter with."""

from __future__ import annotations

from types import SimpleNamespace

from hf_lora_ds.callbacks.learning_rate import LearningRateWatch


def test_the_highest_rate_of_every_step_and_group_is_kept():
    watch = LearningRateWatch()
    for rates in ([0.0, 1e-4], [3e-3, 1e-3], [2e-3]):  # warmup, peak, decay; several parameter groups
        optimizer = SimpleNamespace(param_groups=[{"lr": rate} for rate in rates])
        watch.on_step_begin(None, None, None, optimizer=optimizer)
    assert watch.max_learning_rate == 3e-3


def test_no_optimizer_no_rate():
    watch = LearningRateWatch()
    watch.on_step_begin(None, None, None)
    assert watch.max_learning_rate == 0.0
