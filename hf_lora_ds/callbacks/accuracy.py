"""Answer accuracy at every evaluation, logged as ``eval_accuracy`` through ``Trainer.log``.

Trainer's evaluation gives the loss, which says little about whether answers are right. This callback runs
``hf_lora_ds.eval.evaluate`` whenever Trainer evaluates, on every rank (through the DeepSpeed engine, which gathers
ZeRO-3's weights for it: ``hf_lora_ds.eval.whole_weights``). ``predictions_dir`` keeps each evaluation's
predictions; the accuracy before and after tuning (``log_accuracy_end_points``) joins the same series, so a dashboard
draws one curve. A vision-language model's eval takes its processor in place of the tokenizer (image records).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import (
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Trainer,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from hf_lora_ds.callbacks.base import LoggingCallback
from hf_lora_ds.callbacks.memory import MemoryTraceCallback
from hf_lora_ds.data.records import Record
from hf_lora_ds.eval import Task, evaluate, write_predictions
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = ["AnswerAccuracyCallback", "log_accuracy_end_points"]


class AnswerAccuracyCallback(LoggingCallback):
    """``AnswerAccuracyCallback(tokenizer, records, "sum_to_x").attach(trainer)`` logs ``eval_accuracy``."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
        records: Sequence[dict] | Sequence[Record] | str,
        task: str | Task,
        *,
        batch_size: int = 32,
        system_prompt: str | None = None,
        metric_key_prefix: str = "eval",
        predictions_dir: str | None = None,
        gather_zero3_weights: bool = True,
        image_bounds: PixelBounds | None = None,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.records = records
        self.task = task
        self.batch_size = batch_size
        self.system_prompt = system_prompt
        self.metric_key_prefix = metric_key_prefix
        self.predictions_dir = predictions_dir
        self.gather_zero3_weights = gather_zero3_weights
        self.image_bounds = image_bounds
        self.history: list[dict[str, Any]] = []

    def attach(self, trainer: Trainer) -> AnswerAccuracyCallback:
        """Register with ``trainer`` ahead of any ``MemoryTraceCallback``: that one closes the eval phase in its own
        ``on_evaluate``, and the generation done here belongs to the evaluation, not to the training around it. One
        already registered stays where its caller put it."""
        callbacks = trainer.callback_handler.callbacks
        registered = self in callbacks
        super().attach(trainer)
        tracer = next((i for i, cb in enumerate(callbacks) if isinstance(cb, MemoryTraceCallback)), None)
        if not registered and tracer is not None and callbacks.index(self) > tracer:
            callbacks.remove(self)
            callbacks.insert(tracer, self)
        return self

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> None:
        result = evaluate(
            self._trainer.model_wrapped if self._trainer is not None else model,  # a ZeRO-3 engine can gather
            self.tokenizer,
            self.records,
            self.task,
            batch_size=self.batch_size,
            system_prompt=self.system_prompt,
            gather_zero3_weights=self.gather_zero3_weights,
            image_bounds=self.image_bounds,
        )
        metrics = {f"{self.metric_key_prefix}_accuracy": result.accuracy}
        if self.predictions_dir is not None:
            write_predictions(result, Path(self.predictions_dir, f"predictions_step{state.global_step}.jsonl"))
        self.history.append({"step": state.global_step, **result.summary()})
        self._emit(state, metrics)


def log_accuracy_end_points(trainer: Trainer, before: float, after: float, metric_key_prefix: str = "eval") -> None:
    """Hand every ``report_to`` integration the accuracy before fine-tuning at step 0 and after it at the last step,
    under the key the evaluations during training use (``eval_accuracy``; ``eval/accuracy`` in SwanLab).

    ``Trainer.log`` has no step argument (integrations read ``state.global_step``), so the callbacks get a copy of
    the state at each end point's step. The log history is left alone: trainer_state.json keeps what was measured
    during training, eval_report.json the before/after. Call it on every rank, like ``Trainer.log``.
    """
    key = f"{metric_key_prefix}_accuracy"
    for step, accuracy in ((0, before), (trainer.state.global_step, after)):
        state = copy.copy(trainer.state)
        state.global_step = step
        trainer.control = trainer.callback_handler.on_log(trainer.args, state, trainer.control, {key: accuracy})
