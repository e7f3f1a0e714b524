"""Two ranks (torchrun, gloo, CPU): every metric logged once, from rank 0, carrying the min and max across ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from hf_lora_ds.callbacks.throughput import flops_per_token, flops_shape
from tests.callbacks.callback_helpers import LENGTHS, add_lora, read_local_runs
from tests.callbacks.ddp_run import HOLD_MIB, PEAK_FLOPS, device_mib

SCRIPT = Path(__file__).with_name("ddp_run.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_run(tiny_model_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("ddp")
    env = {k: v for k, v in os.environ.items() if k not in ("SWANLAB_MODE", "SWANLAB_API_KEY")}
    env.update(OMP_NUM_THREADS="1", SWANLAB_ROOT=str(output_dir / "swanlab-home"))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(SCRIPT),
        str(tiny_model_dir),
        str(output_dir),
    ]
    result = subprocess.run(command, cwd=output_dir, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    history = json.loads((output_dir / "log_history.json").read_text())
    return output_dir, history, result.stdout


def _logged(history, key):
    return [entry[key] for entry in history if key in entry]


def _expected_device_mib(phase: str, rank: int) -> dict[str, float]:
    """What rank r's fake allocator makes of each phase: only training sees the spike before the first step."""
    base, spike = device_mib(rank)["base"], device_mib(rank)["spike"]
    if phase == "train":
        return {"before": base, "consumed": 0, "peak": spike - base, "total_peak": spike}
    return {"before": base, "consumed": 0, "peak": 0, "total_peak": base}


@pytest.mark.slow
def test_each_phase_is_logged_once_with_the_min_and_max_over_ranks(two_rank_run):
    """Each rank's fake accelerator has its own numbers (rank 0 the lower base, rank 1 the lower spike), so every
    logged min and max must come from the right rank, stat by stat."""
    output_dir, history, _ = two_rank_run
    for phase, times in (("load", 1), ("train", 1), ("eval", 2)):
        per_rank = [_expected_device_mib(phase, rank) for rank in (0, 1)]
        for stat in ("before", "consumed", "peak", "total_peak"):
            values = [numbers[stat] for numbers in per_rank]
            assert _logged(history, f"memory/{phase}/gpu_{stat}_mib_min") == [min(values)] * times, (phase, stat)
            assert _logged(history, f"memory/{phase}/gpu_{stat}_mib_max") == [max(values)] * times, (phase, stat)
            for kind in ("cpu", "gpu_reserved"):
                assert len(_logged(history, f"memory/{phase}/{kind}_{stat}_mib_min")) == times, (phase, kind, stat)
    train = json.loads((output_dir / "memory_trace.json").read_text())[-1]
    assert [rank["gpu"] for rank in train["ranks"]] == [_expected_device_mib("train", r) for r in (0, 1)]
    assert train["ranks"][0]["gpu"]["peak"] > train["ranks"][1]["gpu"]["peak"]  # rank 0 does not hold every min


@pytest.mark.slow
def test_max_is_the_rank_holding_more(two_rank_run):
    output_dir, history, _ = two_rank_run
    (low,) = _logged(history, "memory/train/cpu_peak_mib_min")
    (high,) = _logged(history, "memory/train/cpu_peak_mib_max")
    assert high - low >= HOLD_MIB * 0.75
    train = json.loads((output_dir / "memory_trace.json").read_text())[-1]
    assert [r["rank"] for r in train["ranks"]] == [0, 1]
    assert train["ranks"][1]["cpu"]["peak"] == high


@pytest.mark.slow
def test_tokens_are_summed_over_ranks_and_mfu_is_per_device(two_rank_run, tiny_model_dir):
    """Each rank runs 2 training forwards of 1 s on the fake clock (evaluations paused): the run lasts 2 s, its
    tokens are both ranks', and MFU divides their FLOP/s by 2 devices' peak."""
    _, history, _ = two_rank_run
    tokens = sum(LENGTHS)
    assert _logged(history, "throughput/run_tokens") == [tokens]
    assert len(_logged(history, "throughput/tokens_per_second")) == 2  # 8 rows / (2 ranks x 2) = 2 steps
    assert _logged(history, "throughput/run_tokens_per_second") == [pytest.approx(tokens / 2.0)]
    (efficiency,) = _logged(history, "throughput/run_padding_efficiency")
    model = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    seq_len = tokens / efficiency / len(LENGTHS)
    expected_mfu = tokens / 2.0 * flops_per_token(flops_shape(model), seq_len) / (2 * PEAK_FLOPS)
    assert _logged(history, "throughput/run_mfu") == [pytest.approx(expected_mfu)]


@pytest.mark.slow
def test_only_rank_zero_prints_and_reports(two_rank_run):
    output_dir, _, stdout = two_rank_run
    assert stdout.count("CPU Peak Memory consumed during the train (max-begin):") == 1
    assert "(min .. max over 2 ranks)" in stdout
    assert len(list((output_dir / "swanlog").glob("run-*"))) == 1
    metrics = read_local_runs(output_dir / "swanlog")
    assert len(metrics["train/memory/train/cpu_peak_mib_max"]) == 1
