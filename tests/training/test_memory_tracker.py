"""hf_lora_ds.training.memory_tracker: the one tracker, on the host (the accelerator path runs on a fake allocator in
tests/callbacks/test_memory.py, and on CUDA in its gpu-marked test)."""

from __future__ import annotations

import mmap
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
    assert tracker.end("eval")["cpu"] == {"before": 150 * MIB, "consumed": 750 * MIB, "peak": 750 * MIB,
                                          "total_peak": 900 * MIB}  # fmt: skip
    tracker.begin("train")  # open already: stays as it is, no reading taken
    assert tracker.end("train")["cpu"]["total_peak"] == 900 * MIB
    assert tracker.end("nothing open") is None
