"""Answer accuracy at every evaluation during training: generated, scored by the task, logged as ``eval_accuracy``
through ``Trainer.log`` and written as ``predictions_step<N>.jsonl``."""

from __future__ import annotations

import json

from transformers import TrainerCallback

from hf_lora_ds.callbacks import AnswerAccuracyCallback, MemoryTraceCallback, log_accuracy_end_points
from hf_lora_ds.eval import Generation, evaluator

RECORDS = [
    {"messages": [{"role": "user", "content": f"{x}="}, {"role": "assistant", "content": f"{x}"}]} for x in range(3)
]


def test_each_evaluation_is_scored_logged_and_written(monkeypatch, make_trainer, qwen_style_tokenizer, tmp_path):
    answers = iter(["0", "1", "x", "0", "1", "2"])  # first evaluation 2/3 right, second 3/3
    monkeypatch.setattr(
        evaluator,
        "generate",
        lambda model, tokenizer, prompts, **kwargs: [Generation(next(answers), 1, True) for _ in prompts],
    )
    trainer = make_trainer(eval_strategy="steps", eval_steps=2)
    callback = AnswerAccuracyCallback(qwen_style_tokenizer, RECORDS, "exact_match", predictions_dir=str(tmp_path))
    callback.attach(trainer)
    trainer.train()
    logged = [
        (entry["step"], entry["eval_accuracy"]) for entry in trainer.state.log_history if "eval_accuracy" in entry
    ]
    assert logged == [(2, 2 / 3), (4, 1.0)]
    assert [entry["step"] for entry in callback.history] == [2, 4]
    written = [json.loads(line) for line in (tmp_path / "predictions_step2.jsonl").read_text().splitlines()]
    assert [(row["output"], row["correct"]) for row in written] == [("0", True), ("1", True), ("x", False)]


def test_end_points_reach_every_integration_at_step_0_and_the_last_step(make_trainer):
    """Before at step 0 and after at the last step, through every callback's on_log (each report_to integration is
    one), while the trainer's own step and log history stay as training left them."""
    seen = []

    class Integration(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append((state.global_step, dict(logs)))

    trainer = make_trainer(max_steps=2)
    trainer.add_callback(Integration())
    trainer.train()
    history = [dict(entry) for entry in trainer.state.log_history]
    seen.clear()
    log_accuracy_end_points(trainer, before=0.1, after=0.9)
    assert seen == [(0, {"eval_accuracy": 0.1}), (2, {"eval_accuracy": 0.9})]
    assert trainer.state.global_step == 2 and trainer.state.log_history == history


def test_attached_after_the_memory_tracer_it_still_runs_first(make_trainer, qwen_style_tokenizer):
    trainer = make_trainer()
    tracer = MemoryTraceCallback(print_blocks=False).attach(trainer)
    accuracy = AnswerAccuracyCallback(qwen_style_tokenizer, RECORDS, "exact_match").attach(trainer)
    handler = trainer.callback_handler.callbacks
    assert handler.index(accuracy) < handler.index(tracer)
