"""Faults during a save: a full disk and a SIGKILL inside ``on_save``, without DeepSpeed. Each leaves the previous
complete checkpoint intact, and ``--resume_from_checkpoint auto`` continues from it (the newer, incomplete one
skipped with a line saying so); the count of steps the resumed run takes proves where it started.

The demo's checkpoints are ~1,040 KiB; a 1,600 KiB tmpfs holds checkpoint-2 and fills up inside checkpoint-4.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers import TrainerCallback

import run_sft
from hf_lora_ds.errors import run_cli
from hf_lora_ds.training.checkpoints import COMPLETE_MARKER
from tests import REPO

RUN = [
    "--eval_file",
    "",
    "--max_steps",
    "6",
    "--save_strategy",
    "steps",
    "--save_steps",
    "2",
    "--logging_steps",
    "1",
    "--per_device_train_batch_size",
    "8",
]


class StepCounter(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def resume_auto(output_dir: Path, capsys) -> list[int]:
    """Run on with ``auto``; the steps this process took."""
    counter = StepCounter()
    run_sft.main([*RUN, "--output_dir", str(output_dir), "--resume_from_checkpoint", "auto"], callbacks=[counter])
    assert (
        f"resume: from {output_dir}/checkpoint-2 (latest complete checkpoint; skipped incomplete checkpoint-4)"
        in capsys.readouterr().out
    )
    return counter.steps


@pytest.mark.parametrize("small_disk", ["1600k"], indirect=True)
def test_full_disk_during_a_save(small_disk, tmp_path, capsys):
    output_dir = small_disk / "out"
    with pytest.raises(SystemExit) as leaving:
        run_cli(lambda: run_sft.main([*RUN, "--output_dir", str(output_dir)]))
    assert leaving.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: saving {output_dir}/checkpoint-4 failed: No space left on device; {output_dir}/"
        "checkpoint-2 is the last complete checkpoint (--resume_from_checkpoint auto continues from "
        "it)"
    ]
    assert (output_dir / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert not (output_dir / "checkpoint-4" / COMPLETE_MARKER).exists()
    roomy = shutil.copytree(output_dir, tmp_path / "copy")  # the user frees space; here: the same files elsewhere
    assert resume_auto(roomy, capsys) == [3, 4, 5, 6]


class ReadOnlyFromStep3(TrainerCallback):
    """The file system turns read-only after checkpoint-2 (as a permission loss or a remount does)."""

    def __init__(self, mount_point: Path):
        self.mount_point = mount_point

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 3:
            subprocess.run(["mount", "-o", "remount,ro", str(self.mount_point)], check=True)


@pytest.mark.parametrize("small_disk", ["1600k"], indirect=True)
def test_read_only_file_system_during_a_save(small_disk, capsys):
    output_dir = small_disk / "out"
    with pytest.raises(SystemExit) as leaving:
        run_cli(
            lambda: run_sft.main([*RUN, "--output_dir", str(output_dir)], callbacks=[ReadOnlyFromStep3(small_disk)])
        )
    assert leaving.value.code == 2
    assert (
        f"error: saving {output_dir}/checkpoint-4 failed: Read-only file system; {output_dir}/checkpoint-2 is the "
        "last complete checkpoint" in capsys.readouterr().err
    )


KILLED_IN_ON_SAVE = """
import os, signal, sys
from transformers import TrainerCallback
import run_sft

class KillInsideSave(TrainerCallback):  # runs before the completion marker is written
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 4:
            os.kill(os.getpid(), signal.SIGKILL)

run_sft.main(sys.argv[1:], callbacks=[KillInsideSave()])
"""


@pytest.mark.slow
def test_sigkill_inside_a_save(tmp_path, capsys):
    output_dir = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_IN_ON_SAVE), *RUN, "--output_dir", str(output_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (output_dir / "checkpoint-4" / "adapter_model.safetensors").is_file()  # written, but never marked
    assert not (output_dir / "checkpoint-4" / COMPLETE_MARKER).exists()
    assert resume_auto(output_dir, capsys) == [3, 4, 5, 6]
