"""MemoryTraceCallback's accelerator path (driven by a fake allocator, as CI has no GPU) and its printed block."""

from __future__ import annotations

import pytest
from callback_helpers import MIB, FakeAllocator
from transformers import TrainerControl, TrainerState, TrainingArguments

from hf_lora_ds.callbacks import MemoryTraceCallback, memory
from hf_lora_ds.callbacks.memory import format_memory_block


@pytest.fixture
def traced(monkeypatch, tmp_path):
    """A callback on the fake allocator: train begins at 100 MiB, an eval inside it spikes to 500 MiB."""
    fake = FakeAllocator()
    monkeypatch.setattr(memory, "device_memory_api", lambda: fake)
    callback = MemoryTraceCallback(print_blocks=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    state, control = TrainerState(), TrainerControl()
    fake.set(100)
    callback.on_train_begin(args, state, control, model=None)
    fake.set(150)
    with callback.phase("eval"):
        fake.set(500)
        fake.set(200)
    fake.set(300)
    fake.set(150)
    callback.on_train_end(args, state, control)
    return callback, state


def test_inner_phase_sees_its_own_peak(traced):
    callback, _ = traced
    eval_record, train_record = callback.records
    assert eval_record["phase"] == "eval"
    assert eval_record["ranks"][0]["gpu"] == {"before": 150, "consumed": 50, "peak": 350, "total_peak": 500}
    assert eval_record["ranks"][0]["gpu_reserved"]["total_peak"] == 1000


def test_outer_phase_keeps_the_peak_of_the_inner_one(traced):
    callback, _ = traced
    train = callback.records[1]["ranks"][0]["gpu"]
    assert train == {"before": 100, "consumed": 50, "peak": 400, "total_peak": 500}


def test_accelerator_metrics_are_logged(traced):
    _, state = traced
    logged = {k: v for entry in state.log_history for k, v in entry.items()}
    assert logged["memory/eval/gpu_peak_mib_max"] == 350
    assert logged["memory/train/gpu_total_peak_mib_min"] == 500
    assert "memory/train/cpu_peak_mib_max" in logged


def test_block_has_peft_lines_and_rank_ranges():
    stats = {"before": 10.0, "consumed": 1.0, "peak": 5.0, "total_peak": 15.0}
    wider = {**stats, "peak": 7.0}
    record = {"phase": "train", "step": 3, "ranks": [{"rank": 0, "cpu": stats}, {"rank": 1, "cpu": wider}]}
    block = format_memory_block(record).splitlines()
    assert block[0] == "CPU Memory before entering the train : 10.0"
    assert block[2] == "CPU Peak Memory consumed during the train (max-begin): 5.0 .. 7.0 (min .. max over 2 ranks)"
    assert len(block) == 4  # no GPU lines on a CPU-only record


def test_enclosing_phase_keeps_a_host_peak_read_at_an_inner_boundary(tmp_path):
    """RSS read when an inner phase ends (700 MiB) counts for the train phase around it, even though it fell again
    before the sampler thread looked (its interval here is an hour, so it never does)."""
    callback = MemoryTraceCallback(print_blocks=False, sample_interval_s=3600)
    readings = iter([100, 150, 700, 120])  # train begins, eval begins, eval ends, train ends
    callback._sampler.rss = lambda: next(readings) * MIB
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=None)
    with callback.phase("eval"):
        pass
    callback.on_train_end(args, state, control)
    eval_record, train_record = callback.records
    assert eval_record["ranks"][0]["cpu"]["total_peak"] == 700
    assert train_record["ranks"][0]["cpu"] == {"before": 100, "consumed": 20, "peak": 600, "total_peak": 700}


@pytest.mark.gpu
def test_cuda_allocator_peaks_are_traced(tmp_path):
    """The real allocator: a 64 MiB tensor allocated and freed inside a phase shows as its peak, not its end."""
    import torch

    callback = MemoryTraceCallback(print_blocks=False)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=None)
    with callback.phase("eval"):
        spike = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
        del spike
    callback.on_train_end(args, state, control)
    eval_gpu = callback.records[0]["ranks"][0]["gpu"]
    assert eval_gpu["peak"] >= 64 and abs(eval_gpu["consumed"]) < 1
    assert callback.records[1]["ranks"][0]["gpu"]["peak"] >= 64  # the enclosing train phase keeps it
