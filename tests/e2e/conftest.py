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

from tests.e2e.launching import REPO, launch_env

TRAIN_RECORDS = 32
EVAL_RECORDS = 6


@pytest.fixture(scope="session", autouse=True)
def deepspeed_cpu_ops():
    """JIT-build DeepSpeed's CPU ops (shm_comm, cpu_adam) once, before the first launch, with the CI script itself.

    Left to the launches, the first one of each op pays a multi-minute ninja build inside its timeout, and its two
    ranks race on the same build directory. Built here, every launch loads the cached library from
    ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). Each pytest-xdist worker runs this fixture: the
    first builds, the others wait on the build's lock and then load the cached library.
    """
    start = time.perf_counter()
    script = str(REPO / ".ci" / "prebuild_deepspeed_ops.sh")
    done = subprocess.run(["bash", script], env=launch_env(), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"building DeepSpeed's CPU ops failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    print(f"\nDeepSpeed CPU ops ready in {time.perf_counter() - start:.0f} s:\n{done.stdout.strip()}")


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
