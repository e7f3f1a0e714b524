"""The samples each data source gave the run, in the log history (what a mixture actually drew)."""

from __future__ import annotations

from transformers import TrainerCallback

__all__ = ["SourceCountsLog"]


class SourceCountsLog(TrainerCallback):
    """Puts the samples per data source into the log history as ``data/samples/<source>``, so trainer_state.json
    and the run report record what a mixture actually drew."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        entry = {f"data/samples/{name}": count for name, count in self.counts.items()}
        state.log_history.append({**entry, "step": state.global_step})
