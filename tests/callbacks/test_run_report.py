"""Memory, throughput and report callbacks together on one plain-Trainer run (CPU, 4 steps, evals and a save).

Exact rates and MFU are checked on a fake clock in test_throughput.py; exact memory figures on a fake
allocator in test_memory.py and, across 2 ranks, in test_ddp.py."""

from __future__ import annotations

import gc
import json
import mmap
import threading
import time
from pathlib import Path

import psutil
import pytest
from transformers import TrainerCallback

from hf_lora_ds.callbacks import MemoryTraceCallback, RunReportCallback, ThroughputCallback
from tests.callbacks.callback_helpers import LENGTHS, flat_collate, lora_model

SPIKE_MIB = 48
MIB = 1 << 20


SAMPLER = "hf_lora_ds-rss-sampler"


class SamplerThreads(TrainerCallback):
    """The RSS sampler threads this run started: alive during a step and not there before the run (threads of
    other tests' runs, say ones that failed on purpose, are not this run's to judge)."""

    def __init__(self) -> None:
        self.before = set(threading.enumerate())
        self.seen: set[threading.Thread] = set()

    def on_step_end(self, args, state, control, **kwargs):
        self.seen |= {t for t in threading.enumerate() if t.name == SAMPLER and t not in self.before}


@pytest.fixture(scope="module")
def run(make_trainer, qwen_style_tokenizer):
    samplers = SamplerThreads()
    memory = MemoryTraceCallback(sample_interval_s=0.005)
    gc.collect()  # no collection inside the phase: garbage freed there would hide part of the spike's rise
    process = psutil.Process()
    with memory.phase("load"):
        before = process.memory_info().rss / MIB
        # An anonymous mapping, every page written: in .ci/run a bytes object of this size twice left RSS where it
        # was (freed heap reused: peak 0.0); a mapping grows RSS whatever the allocator keeps (test_memory_tracker).
        spike = mmap.mmap(-1, SPIKE_MIB << 20)
        for offset in range(0, len(spike), mmap.PAGESIZE):
            spike[offset] = 1
        held = process.memory_info().rss / MIB
        # held 2 s: on a loaded CI machine the sampler (every 5 ms) once took no sample in the 0.3 s it was held
        time.sleep(2.0)
        spike.close()
        model = lora_model(qwen_style_tokenizer)
    trainer = make_trainer(model=model, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=4)
    memory.attach(trainer)
    throughput = ThroughputCallback().attach(trainer)
    trainer.add_callback(RunReportCallback())
    trainer.add_callback(samplers)
    trainer.train()
    samplers.alive_after = [t for t in samplers.seen if t.is_alive()]  # right away: no later test's time to exit
    trainer.samplers = samplers
    trainer.spike_rss = {"before": before, "held": held}  # what this process read around the spike, MiB
    return trainer, memory, throughput


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_every_phase_is_traced_once_in_order(run):
    trainer, memory, _ = run
    assert [(r["phase"], r["step"]) for r in memory.records] == [
        ("load", 0),
        ("eval", 2),
        ("eval", 4),
        ("save", 4),
        ("train", 4),
    ]
    assert len(_logged(trainer, "memory/train/cpu_peak_mib_max")) == 1
    assert len(_logged(trainer, "memory/eval/cpu_total_peak_mib_min")) == 2


def test_load_phase_sees_the_spike_it_freed(run):
    """The phase's high-water mark is at least what a reading while the spike was held saw, and its end is below it
    by most of the rise that reading saw (the spike was freed)."""
    trainer, memory, _ = run
    load = memory.records[0]["ranks"][0]["cpu"]
    seen = {**trainer.spike_rss, **load}
    rise = trainer.spike_rss["held"] - trainer.spike_rss["before"]
    assert rise >= SPIKE_MIB * 0.8, seen  # the spike was resident: the checks below can fail
    assert load["total_peak"] >= trainer.spike_rss["held"] - SPIKE_MIB * 0.2, seen
    assert load["total_peak"] - (load["before"] + load["consumed"]) >= rise * 0.5, seen


def test_train_phase_encloses_its_evaluations(run):
    _, memory, _ = run
    train = memory.records[-1]["ranks"][0]["cpu"]
    for record in memory.records[1:-1]:
        assert train["total_peak"] >= record["ranks"][0]["cpu"]["total_peak"]


def test_metrics_are_logged_as_min_and_max(run):
    trainer, memory, _ = run
    train = memory.records[-1]["ranks"][0]["cpu"]
    assert _logged(trainer, "memory/train/cpu_peak_mib_min") == [train["peak"]]
    assert _logged(trainer, "memory/train/cpu_peak_mib_max") == [train["peak"]]


def test_trace_file_holds_the_records(run):
    trainer, memory, _ = run
    saved = json.loads((Path(trainer.args.output_dir) / "memory_trace.json").read_text())
    assert saved == memory.records


def test_sampler_thread_stops(run):
    trainer, _, _ = run
    assert trainer.samplers.seen, "the run sampled RSS from a thread of its own"
    assert trainer.samplers.alive_after == []


def test_run_token_counts_are_exact(run):
    trainer, _, _ = run
    dataset = trainer.train_dataset
    assert _logged(trainer, "throughput/run_tokens") == [dataset.real_tokens()]
    assert _logged(trainer, "throughput/run_supervised_tokens") == [dataset.supervised_tokens()]


def test_report_is_written_at_train_end(run):
    trainer, _, _ = run
    html = (Path(trainer.args.output_dir) / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3  # loss, memory, throughput; no accuracy given
    assert "memory per phase and rank" in html
    changed = html[html.index('id="changed-arguments"') : html.index('id="other-arguments"')]
    assert "eval_steps" in changed and "save_steps" in changed  # set by the fixture
    assert "adam_beta1" not in changed and "report_to" not in changed  # at their defaults


def test_padding_free_batches_are_fully_efficient(make_trainer, caplog):
    throughput = ThroughputCallback()
    trainer = make_trainer(collate=flat_collate)
    trainer.add_callback(throughput)  # not attached: metrics still reach log_history, with a warning
    with caplog.at_level("WARNING"):
        trainer.train()
    assert "attach(trainer)" in caplog.text
    assert _logged(trainer, "throughput/padding_efficiency") == [1.0, 1.0]
    assert _logged(trainer, "throughput/run_tokens") == [sum(LENGTHS)]
