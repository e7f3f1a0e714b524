"""Memory per phase and per rank: accelerator memory and host RAM, before / consumed / peak / total peak.

Users move between ZeRO stages and offload to fit a model, trading GPU memory against host RAM on every rank; Trainer's
own tracker reports one rank and skips the evaluations and saves inside training. This callback measures each phase
(``train``, ``eval``, ``save``, ``predict``, and any ``with callback.phase(name):``) on every rank through
hf_lora_ds.training.memory_tracker and logs the min and max across ranks
(``memory/<phase>/<kind>_<stat>_mib_<min|max>``; kinds ``gpu``, ``gpu_reserved``, ``cpu``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.utils import logging

from hf_lora_ds.callbacks.base import LoggingCallback
from hf_lora_ds.distributed import gather_from_ranks, rank_and_world
from hf_lora_ds.training.memory_tracker import MemoryTracker, PhaseStats

__all__ = ["MemoryTraceCallback", "format_memory_block"]

logger = logging.get_logger(__name__)

_MIB = 2**20
_STATS = ("before", "consumed", "peak", "total_peak")


def _in_mib(stats: PhaseStats) -> dict[str, dict[str, float]]:
    return {
        kind: {stat: round(n_bytes / _MIB, 2) for stat, n_bytes in values.items()} for kind, values in stats.items()
    }


def _range(ranks: list[dict[str, Any]], kind: str, stat: str) -> str:
    values = [r[kind][stat] for r in ranks]
    low, high = min(values), max(values)
    if len(values) == 1 or low == high:
        return f"{low:.1f}"
    return f"{low:.1f} .. {high:.1f} (min .. max over {len(values)} ranks)"


def format_memory_block(record: dict[str, Any]) -> str:
    """The lines PEFT's DeepSpeed examples print, in MiB, for one gathered phase record."""
    phase, ranks = record["phase"], record["ranks"]
    lines = []
    for kind, label in (("gpu", "GPU"), ("cpu", "CPU")):
        if kind in ranks[0]:
            lines += [
                f"{label} Memory before entering the {phase} : {_range(ranks, kind, 'before')}",
                f"{label} Memory consumed at the end of the {phase} (end-begin): {_range(ranks, kind, 'consumed')}",
                f"{label} Peak Memory consumed during the {phase} (max-begin): {_range(ranks, kind, 'peak')}",
                f"{label} Total Peak Memory consumed during the {phase} (max): {_range(ranks, kind, 'total_peak')}",
            ]
    if "gpu_reserved" in ranks[0]:
        lines.append(
            f"GPU Reserved Total Peak Memory during the {phase} (max): {_range(ranks, 'gpu_reserved', 'total_peak')}"
        )
    return "\n".join(lines)


def _metrics(record: dict[str, Any]) -> dict[str, float]:
    out = {}
    ranks = record["ranks"]
    for kind in ranks[0]:
        if kind == "rank":
            continue
        for stat in _STATS:
            values = [r[kind][stat] for r in ranks]
            out[f"memory/{record['phase']}/{kind}_{stat}_mib_min"] = min(values)
            out[f"memory/{record['phase']}/{kind}_{stat}_mib_max"] = max(values)
    return out


class MemoryTraceCallback(LoggingCallback):
    """Traces accelerator memory and host RAM per phase and rank; works in any ``transformers.Trainer``.

    >>> memory = MemoryTraceCallback()
    >>> with memory.phase("load"):          # doctest: +SKIP
    ...     model = AutoModelForCausalLM.from_pretrained(path)
    >>> trainer = Trainer(model=model, args=args, train_dataset=ds)  # doctest: +SKIP
    >>> memory.attach(trainer)              # doctest: +SKIP

    Model loading happens before the trainer exists, so only a ``phase`` the caller wraps sees it (every rank must
    enter it). Generation in ``AnswerAccuracyCallback.on_evaluate`` belongs to ``eval``: attached with ``attach``, that
    callback runs before this one, which closes the phase.

    ``records`` holds every gathered phase (``{"phase", "step", "ranks": [{"rank", "cpu": {...}, ...}]}``); rank 0
    also writes them to ``<output_dir>/<trace_file>`` for ``report.html``.
    """

    def __init__(
        self, sample_interval_s: float = 0.01, print_blocks: bool = True, trace_file: str | None = "memory_trace.json"
    ) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self._print_blocks = print_blocks
        self._trace_file = trace_file
        self._tracker = MemoryTracker(sample_interval_s)
        self._pending: list[dict[str, Any]] = []  # finished on this rank, not yet gathered
        self._state: TrainerState | None = None
        self._output_dir: str | None = None

    # ---- measuring on this rank ----

    def _begin(self, name: str) -> None:
        self._tracker.begin(name)

    def _end(self, name: str, record_as: str | None = None) -> bool:
        """Close phase ``name`` on this rank and queue its numbers; False when it was not open."""
        stats = self._tracker.end(name)
        if stats is not None:
            self._pending.append({"phase": record_as or name, "stats": _in_mib(stats)})
        return stats is not None

    def abandon_open_phases(self) -> None:
        """Drop the phases a failed run left open (training, an evaluation), unpublished: no collective while this
        rank is failing, and no sampler thread left running after the run."""
        self._tracker.abandon()

    # ---- publishing across ranks ----

    def _publish(self, state: TrainerState) -> None:
        """Gather the queued phases from every rank, print them on rank 0, log them on all (a collective)."""
        local, self._pending = self._pending, []
        per_rank = gather_from_ranks(local)
        for index, entry in enumerate(per_rank[0]):
            ranks = [{"rank": r, **records[index]["stats"]} for r, records in enumerate(per_rank)]
            record = {"phase": entry["phase"], "step": state.global_step, "ranks": ranks}
            self.records.append(record)
            if self._print_blocks:
                logger.info(format_memory_block(record))
            self._emit(state, _metrics(record))
        self._write_trace_file()

    def _write_trace_file(self) -> None:
        if self._trace_file is None or self._output_dir is None or rank_and_world()[0] != 0:
            return
        os.makedirs(self._output_dir, exist_ok=True)
        with open(os.path.join(self._output_dir, self._trace_file), "w", encoding="utf-8") as f:
            json.dump(self.records, f, indent=1)

    def _finish(self, state: TrainerState, name: str, record_as: str | None = None) -> None:
        if self._end(name, record_as):
            self._publish(state)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Trace a phase no trainer event marks (the model load). Enter it on every rank."""
        self._begin(name)
        try:
            yield
        except BaseException:
            if self._end(name):
                self._pending.pop()  # no collective while this rank is failing: the others would wait forever
            raise
        self._end(name)
        if self._state is not None:  # otherwise logged when training begins
            self._publish(self._state)

    # ---- trainer events ----

    def _remember(self, args: TrainingArguments, state: TrainerState) -> None:
        self._state, self._output_dir = state, args.output_dir

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._remember(args, state)
        if self._pending:
            self._publish(state)
        self._begin("train")
        if args.eval_on_start:
            self._begin("eval")

    def _after_step_or_epoch(self, control: TrainerControl) -> None:
        if control.should_evaluate:
            self._begin("eval")  # a save that follows begins when the evaluation ends
        elif control.should_save:
            self._begin("save")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._after_step_or_epoch(control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._after_step_or_epoch(control)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._remember(args, state)
        self._begin("eval")  # no-op inside training; a standalone evaluate()/predict() is seen from here on

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "eval")
        if control.should_save:
            self._begin("save")

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "eval", record_as="predict")

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "save")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        for name in ("eval", "save"):  # left open only if training stopped between trigger and event
            self._end(name)
        self._finish(state, "train")

    # ---- LoraSFTTrainer's own events, after Trainer's have ended (hf_lora_ds.trainer.lora_sft_trainer) ----

    def on_final_save_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._remember(args, state)
        self._begin("save")

    def on_final_save_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._finish(state, "save")

    def on_train_failed(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.abandon_open_phases()  # no on_train_end will come: stop the RSS sampler here
