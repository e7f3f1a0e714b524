"""End-to-end fixtures: DeepSpeed's CPU ops built once, and tiny sum-to-x files next to ``tiny_model_dir``.

The model is the shared ``tiny_model_dir`` (tests/conftest.py): Qwen2, hidden 32, 2 layers, saved with its
tokenizer like a user's ``--model_name_or_path``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e import deepspeed_ops
from tests.e2e.launching import launch_env

TRAIN_RECORDS = 32
EVAL_RECORDS = 6


@pytest.fixture(scope="session")
def deepspeed_cpu_ops():
    """DeepSpeed's CPU ops (cpu_adam) built before the first launch (tests/e2e/deepspeed_ops.py): this waits
    for the build the suite started in the background as it began, or builds them where it did not (one file run
    alone), and every launch then loads the cached libraries. Each pytest-xdist worker runs this fixture."""
    start = time.perf_counter()
    # The limit catches a hung build (1-3 min on 2 cores the first time, seconds once cached)
    done = subprocess.run(deepspeed_ops.command(), env=launch_env(), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"building DeepSpeed's CPU ops failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    print(f"\nDeepSpeed CPU ops ready in {time.perf_counter() - start:.0f} s:\n{done.stdout.strip()}")


@pytest.fixture(autouse=True)
def deepspeed_cpu_ops_before_a_launch(request):
    """Only the tests that launch (the slow ones) wait for the build: a quick test here has nothing to wait for."""
    if request.node.get_closest_marker("slow"):
        request.getfixturevalue("deepspeed_cpu_ops")


def sum_record(x: int) -> dict[str, str]:
    a = 1 + x % 9
    return {"instruction": f"{x}=", "input": "", "output": f"王大丫丫的回答是--->{a} + {x - a}"}


@pytest.fixture(scope="session")
def sum_data(tmp_path_factory) -> dict[str, Path]:
    """32 training and 6 held-out sum-to-x records (distinct x, so every training sample is a distinct sequence)."""
    root = tmp_path_factory.mktemp("sum-to-x")
    xs = [10 + 13 * i for i in range(TRAIN_RECORDS + EVAL_RECORDS)]
    files = {"train": root / "train.json", "eval": root / "eval.json"}
    for name, chosen in (("train", xs[:TRAIN_RECORDS]), ("eval", xs[TRAIN_RECORDS:])):
        files[name].write_text(json.dumps([sum_record(x) for x in chosen], ensure_ascii=False), encoding="utf-8")
    return files
