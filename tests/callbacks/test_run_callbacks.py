"""The run's callbacks are attached once each, in the order their events depend on, the ones --run_callbacks chooses
(a trainer built in code: what its arguments name, no signal handler unless asked), after the ones the trainer was
given, which keep their places and their order (a kind among them is the one used: the memory tracer has measured the
model load before the trainer exists); the progress bar stays Trainer's own."""

from __future__ import annotations

import signal

import pytest
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from hf_lora_ds.callbacks import (
    AnswerAccuracyCallback,
    CheckpointCompletionCallback,
    DivergenceCallback,
    EngineCallback,
    MemoryTraceCallback,
    RunReportCallback,
    SourceCountsLog,
    ThroughputCallback,
)
from tests.trainer.test_lora_sft_trainer import RECORDS, make_trainer

ORDER = [
    EngineCallback,
    DivergenceCallback,
    SourceCountsLog,
    AnswerAccuracyCallback,
    MemoryTraceCallback,
    ThroughputCallback,
    CheckpointCompletionCallback,
    RunReportCallback,
]


def ours(trainer) -> list[type]:
    return [type(cb) for cb in trainer.callback_handler.callbacks if type(cb) in ORDER]


class _Probe(TrainerCallback):
    pass


def test_the_callers_callbacks_keep_their_places_and_the_runs_own_follow_in_order(
    tiny_model, qwen_style_tokenizer, tmp_path
):
    memory = MemoryTraceCallback()
    accuracy = AnswerAccuracyCallback(qwen_style_tokenizer, RECORDS[:2], "exact_match")
    given = [_Probe(), memory, accuracy, _Probe()]  # accuracy after the tracer: the caller's order, kept
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, callbacks=given)
    handler = trainer.callback_handler.callbacks
    assert [cb for cb in handler if cb in given] == given  # none removed, none moved
    assert handler.index(given[-1]) < handler.index(next(cb for cb in handler if isinstance(cb, EngineCallback)))
    assert ours(trainer) == [MemoryTraceCallback, AnswerAccuracyCallback] + [
        kind for kind in ORDER if kind not in (MemoryTraceCallback, AnswerAccuracyCallback)
    ]
    assert memory._trainer is trainer and accuracy._trainer is trainer  # their metrics go through Trainer.log


def test_without_eval_records_there_is_no_accuracy_callback(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path)
    assert ours(trainer) == [kind for kind in ORDER if kind is not AnswerAccuracyCallback]


def test_the_progress_bar_is_trainers_own(tiny_model, qwen_style_tokenizer, tmp_path):
    """The setup-first bar is the command line's choice (hf_lora_ds.cli.run), not the trainer's."""
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, disable_tqdm=False)
    bars = [type(cb) for cb in trainer.callback_handler.callbacks if isinstance(cb, ProgressCallback)]
    assert bars == [ProgressCallback]


class _SigtermHandlerInTraining(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.handler = signal.getsignal(signal.SIGTERM)


@pytest.mark.parametrize(
    ("chosen", "attached"),
    [
        ("none", [CheckpointCompletionCallback]),
        ("memory,report", [MemoryTraceCallback, CheckpointCompletionCallback, RunReportCallback]),
    ],
)
def test_a_trainer_built_in_code_gets_the_callbacks_its_arguments_name(
    tiny_model, qwen_style_tokenizer, tmp_path, chosen, attached
):
    before = signal.getsignal(signal.SIGTERM)
    probe = _SigtermHandlerInTraining()
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, callbacks=[probe], run_callbacks=chosen)
    assert ours(trainer) == attached
    trainer.train()
    assert probe.handler is before  # no signal handler installed unless asked
    assert not trainer.preempted and (tmp_path / "out" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "out" / "report.html").is_file() == ("report" in chosen)
