"""MemoryTraceCallback's accelerator path (driven by a fake allocator, as CI has no GPU) and its printed block."""

from __future__ import annotations

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from hf_lora_ds.callbacks import AnswerAccuracyCallback, MemoryTraceCallback
from hf_lora_ds.callbacks.memory import format_memory_block
from hf_lora_ds.eval import evaluator
from hf_lora_ds.eval.generation import Generation
from hf_lora_ds.training import memory_tracker
from tests.callbacks.callback_helpers import MIB, FakeAllocator


@pytest.fixture
def traced(monkeypatch, tmp_path):
    """A callback on the fake allocator: train begins at 100 MiB, an eval inside it spikes to 500 MiB."""
    fake = FakeAllocator()
    monkeypatch.setattr(
        memory_tracker, "device_memory_api", lambda: fake
    )  # hf_lora_ds.training.memory_tracker: the one tracker
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
    callback._tracker._sampler.rss = lambda: next(readings) * MIB
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


def test_generation_in_an_evaluation_is_charged_to_eval(monkeypatch, make_trainer, qwen_style_tokenizer):
    """AnswerAccuracyCallback generates in on_evaluate; attached after the memory tracer, it still runs inside the
    eval phase (the tracer closes that phase in its own on_evaluate), so a generation spike is eval's, not train's."""
    fake = FakeAllocator()
    monkeypatch.setattr(memory_tracker, "device_memory_api", lambda: fake)

    def generate(module, tokenizer, prompts, **kwargs):  # a generation pass whose allocations peak at 900 MiB
        fake.set(900)
        fake.set(0)
        return [Generation("yo", 2, True) for _ in prompts]

    monkeypatch.setattr(evaluator, "generate", generate)
    trainer = make_trainer(eval_strategy="steps", eval_steps=2)
    tracer = MemoryTraceCallback(print_blocks=False).attach(trainer)
    records = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    AnswerAccuracyCallback(qwen_style_tokenizer, records, "exact_match").attach(trainer)
    trainer.train()
    evals = [r["ranks"][0]["gpu"] for r in tracer.records if r["phase"] == "eval"]
    assert len(evals) == 2 and all(stats["peak"] == 900 for stats in evals)
    accuracy = [entry["eval_accuracy"] for entry in trainer.state.log_history if "eval_accuracy" in entry]
    assert accuracy == [1.0, 1.0]  # the generation really ran at both evaluations, scored by the task


def test_a_block_measured_inside_a_phase_leaves_the_phase_its_peak(monkeypatch, tmp_path):
    """The eval measures its generation with its own tracker; resetting the allocator's mark for that block must not
    erase the peak the enclosing traced phase reached before it."""
    fake = FakeAllocator()
    monkeypatch.setattr(memory_tracker, "device_memory_api", lambda: fake)
    callback = MemoryTraceCallback(print_blocks=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=None)
    fake.set(800)
    fake.set(100)
    with memory_tracker.measure_peak("cuda") as peak:
        fake.set(300)
        fake.set(100)
    callback.on_train_end(args, state, control)
    assert peak.accelerator_bytes == 300 * MIB
    assert callback.records[-1]["ranks"][0]["gpu"]["total_peak"] == 800
