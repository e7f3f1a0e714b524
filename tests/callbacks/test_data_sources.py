"""The samples each data source gave the run land in the log history, which trainer_state.json and the report keep."""

from __future__ import annotations

from transformers import TrainerState

from hf_lora_ds.callbacks.data_sources import SourceCountsLog


def test_counts_are_logged_per_source_at_train_begin():
    state = TrainerState()
    state.global_step = 7  # a resumed run logs them at its first step
    SourceCountsLog({"a.jsonl": 30, "b_dir": 12}).on_train_begin(None, state, None)
    assert state.log_history == [{"data/samples/a.jsonl": 30, "data/samples/b_dir": 12, "step": 7}]
