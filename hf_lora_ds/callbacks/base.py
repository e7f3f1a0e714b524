"""What the metric callbacks share: JSON-safe values, the resolved DeepSpeed config, and a route into ``Trainer.log``.

A ``TrainerCallback`` never receives the trainer, and the trainer runs user callbacks *after* its ``report_to``
integrations, so a callback that only edits the ``logs`` dict in ``on_log`` reaches no tracker. Metrics that must
reach every ``report_to`` target (SwanLab, TensorBoard, ...) therefore go through ``trainer.log(...)``, which needs
the trainer: ``attach(trainer)`` supplies it. Without it the metrics still land in ``state.log_history`` (and so in
``report.html``), and a warning says how to fix it.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerState
from transformers.utils import logging

__all__ = ["LoggingCallback", "jsonable"]

logger = logging.get_logger(__name__)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, enum.Enum):
        return obj.value
    return str(obj)


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON types (sets → sorted lists, enums → values, anything else → ``str``)."""
    return json.loads(json.dumps(obj, default=_json_default))


class LoggingCallback(TrainerCallback):
    """Base for callbacks whose metrics must reach ``Trainer.log`` (and so every ``report_to`` integration)."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._warned_unattached = False

    def attach(self, trainer: Trainer) -> LoggingCallback:
        """Register this callback with ``trainer`` (once) and log through it; returns ``self``."""
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        self._trainer = trainer
        return self

    def _emit(self, state: TrainerState, metrics: dict[str, float]) -> None:
        """Log ``metrics`` at the current step. Call it on every rank: ``Trainer.log`` expects that."""
        if not metrics:
            return
        if self._trainer is not None:
            self._trainer.log(dict(metrics))
            return
        if not self._warned_unattached and state.is_world_process_zero:
            logger.warning(
                "%s was passed to Trainer(callbacks=...) without attach(): its metrics go to "
                "trainer.state.log_history and report.html but not to report_to integrations. "
                "Use `%s(...).attach(trainer)` instead.",
                type(self).__name__,
                type(self).__name__,
            )
        self._warned_unattached = True
        state.log_history.append({**metrics, "step": state.global_step})
