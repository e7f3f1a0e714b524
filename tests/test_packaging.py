"""The package as ``pip install`` leaves it, away from a clone: the wheel is built from this tree and installed into
a fresh virtual environment (no editable install; the dependencies are this interpreter's, reached by a path entry
so that nothing is downloaded), and every command runs from an empty directory. The installed command trains the
bundled demo, a shipped DeepSpeed config resolves by its short name under ``deepspeed --module``, ``--deepspeed
auto`` under ``torchrun -m``, and the planner plans a 7B offline from the shipped model configs."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from launching import free_port, launch_env  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        cwd=root,
    )
    (wheel,) = (root / "dist").glob("hf_lora_ds-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The dependencies: this interpreter's site-packages as plain path entries (their .pth files, among them the
    # editable install of this repository, are not processed from there).
    dependencies = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    Path(purelib, "dependencies.pth").write_text("\n".join(dict.fromkeys(dependencies)) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    empty = root / "empty"
    empty.mkdir()
    env = {**launch_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return {"python": str(python), "cwd": empty, "env": env}


def run(installed: dict, *command: str) -> subprocess.CompletedProcess:
    done = subprocess.run(list(command), cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def test_the_wheel_is_what_runs(installed):
    done = run(installed, installed["python"], "-c", "import hf_lora_ds; print(hf_lora_ds.__file__)")
    assert done.stdout.strip().startswith(str(Path(installed["python"]).parents[1])), done.stdout


def test_installed_command_trains_the_bundled_demo(installed):
    done = run(installed, "hf-lora-sft", "--max_steps", "2", "--output_dir", "out")
    # Quiet: no warning the package could have prevented (hf_lora_ds.command_process); bitsandbytes is installed here.
    noise = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if "Warning" in line or "bitsandbytes" in line or "gemm_4bit_forward" in line
    ]
    assert noise == [], "\n".join(noise)
    out = installed["cwd"] / "out"
    assert (out / "adapter_model.safetensors").is_file()
    report = json.loads((out / "eval_report.json").read_text())
    assert report["before"]["num_samples"] == report["after"]["num_samples"] == 150


def test_deepspeed_module_with_a_shipped_config_by_name(installed):
    done = run(
        installed,
        installed["python"],
        "-m",
        "deepspeed.launcher.runner",
        "--num_gpus",
        "1",
        "--master_port",
        str(free_port()),
        "--module",
        "hf_lora_ds.run_sft",
        "--deepspeed",
        "stage3",
        "--max_steps",
        "1",
        "--eval_file",
        "",
        "--output_dir",
        "ds",
    )
    assert "engine: DeepSpeed ZeRO-3, world size 1" in done.stdout, done.stdout[-3000:]


def test_torchrun_module_with_deepspeed_auto(installed):
    done = run(
        installed,
        installed["python"],
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        str(free_port()),
        "-m",
        "hf_lora_ds.run_sft",
        "--deepspeed",
        "auto",
        "--max_steps",
        "1",
        "--eval_file",
        "",
        "--output_dir",
        "auto",
    )
    assert "--deepspeed auto: " in done.stdout and "engine: DeepSpeed ZeRO-" in done.stdout, done.stdout[-3000:]


def test_planner_plans_a_7b_offline(installed):
    done = run(
        installed,
        installed["python"],
        "-m",
        "hf_lora_ds.plan",
        "--model_name_or_path",
        "Qwen/Qwen2.5-7B-Instruct",
        "--device",
        "gpu",
        "--device_memory",
        "24GiB",
        "--json",
    )
    rows = json.loads(done.stdout)
    assert {row["config"] for row in rows} >= {"none", "stage3.json", "stage3_offload.json"}
