"""hf_lora_ds.training.memory_tracker: the one tracker, on the host (the accelerator path runs on a fake allocator in
tests/callbacks/test_memory.py, and on CUDA in its gpu-marked test)."""

from __future__ import annotations

import mmap
import threading
import time

from hf_lora_ds.training.memory_tracker import MemoryTracker, measure_peak

MIB = 2**20


def test_a_measured_block_sees_a_host_spike_that_is_gone_at_its_end():
    with measure_peak("cpu") as peak:
        before = MemoryTracker().read()["cpu"]
        spike = mmap.mmap(-1, 64 * MIB)  # fresh pages, each touched: RSS really grows (freed heap is not reused)
        for page in range(0, 64 * MIB, mmap.PAGESIZE):
            spike[page] = 1
        time.sleep(0.1)
        spike.close()
    assert peak.accelerator_bytes is None  # a model on the CPU has no device peak, even on a GPU host
    assert peak.host_rss_bytes >= before + 60 * MIB


def test_nested_phases_each_report_their_own_span_and_the_outer_keeps_the_inner_peak():
    tracker = MemoryTracker(sample_interval_s=3600)  # boundary readings only
    readings = iter([100, 150, 900, 130])
    tracker._sampler.rss = lambda: next(readings) * MIB
    tracker.begin("train")  # 100
    tracker.begin("eval")  # 150
    assert tracker.end("eval")["cpu"] == {
        "before": 150 * MIB,
        "consumed": 750 * MIB,
        "peak": 750 * MIB,
        "total_peak": 900 * MIB,
    }
    tracker.begin("train")  # open already: stays as it is, no reading taken
    assert tracker.end("train")["cpu"]["total_peak"] == 900 * MIB
    assert tracker.end("nothing open") is None


def test_ending_the_last_phase_returns_only_once_the_sampler_thread_is_gone(monkeypatch):
    """The sampler is held inside a reading when the phase ends; ``end`` must wait for it (join), not only ask it
    to stop, or the thread outlives the run."""
    tracker = MemoryTracker(sample_interval_s=0.001)
    sampler = tracker._sampler
    inside, release = threading.Event(), threading.Event()
    read_rss = sampler.rss

    def slow_rss() -> int:
        if threading.current_thread() is sampler._thread:
            inside.set()
            release.wait(0.5)  # a slow reading; end() below must outwait it
        return read_rss()

    monkeypatch.setattr(sampler, "rss", slow_rss)
    tracker.begin("train")
    thread = sampler._thread
    assert inside.wait(60)  # catches a sampler that never reads (a hang): it reads within ms
    tracker.end("train")
    assert not thread.is_alive()


def test_abandoning_a_failed_run_s_phases_stops_the_sampler_thread():
    tracker = MemoryTracker(sample_interval_s=0.001)
    tracker.begin("train")
    tracker.begin("eval")
    thread = tracker._sampler._thread
    tracker.abandon()
    assert not thread.is_alive()
    assert tracker.end("train") is None  # nothing left open
    tracker.begin("train")  # and a new phase samples again
    assert tracker._sampler._thread.is_alive()
    tracker.end("train")
