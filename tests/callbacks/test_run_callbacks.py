"""The run's callbacks are attached once each, in the order their events depend on, the ones --run_callbacks chooses
(a trainer built in code: what its arguments name, no signal handler unless asked), and the ones given to the trainer
are the ones used (the memory tracer has measured the model load before the trainer exists)."""

from __future__ import annotations

import signal

import pytest
from transformers import TrainerCallback

from hf_lora_ds.callbacks import (
    AnswerAccuracyCallback,
    CheckpointCompletionCallback,
    DivergenceCallback,
    EngineCallback,
    LearningRateWatch,
    MemoryTraceCallback,
    PreemptionCallback,
    RunReportCallback,
    SourceCountsLog,
    ThroughputCallback,
)
from tests.trainer.test_lora_sft_trainer import RECORDS, make_trainer

ORDER = [
    LearningRateWatch,
    PreemptionCallback,
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


def test_the_run_callbacks_in_their_order_with_the_given_ones_used(tiny_model, qwen_style_tokenizer, tmp_path):
    memory = MemoryTraceCallback()
    accuracy = AnswerAccuracyCallback(qwen_style_tokenizer, RECORDS[:2], "exact_match")
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, callbacks=[accuracy, memory])
    assert ours(trainer) == ORDER
    handler = trainer.callback_handler.callbacks
    assert memory in handler and accuracy in handler
    assert trainer.run_callbacks.memory is memory and memory._trainer is trainer  # its metrics go through Trainer.log
    assert trainer.run_callbacks.preemption is not None and not trainer.preempted


def test_without_eval_records_there_is_no_accuracy_callback(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path)
    assert ours(trainer) == [kind for kind in ORDER if kind is not AnswerAccuracyCallback]


class _SigtermHandlerInTraining(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.handler = signal.getsignal(signal.SIGTERM)


@pytest.mark.parametrize(
    ("chosen", "attached"),
    [
        ("none", [LearningRateWatch, CheckpointCompletionCallback]),
        ("memory,report", [LearningRateWatch, MemoryTraceCallback, CheckpointCompletionCallback, RunReportCallback]),
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
