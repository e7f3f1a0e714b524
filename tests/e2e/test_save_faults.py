"""Save faults under 2 ranks, ZeRO-3 (deepspeed launcher) and FSDP2 (the shipped Accelerate config): a file system
that turns read-only, then one that fills up, each while checkpoint-4 is written. Each fault stops the run with one
line from rank 0 naming the checkpoint, the cause and the last complete checkpoint; checkpoint-2 stays complete; and
``--resume_from_checkpoint auto`` continues from it: the second fault is met by the first resume. A resume past an
incomplete checkpoint-4 through to the end, under ZeRO and FSDP2 with 2 ranks, is test_resume.py's (a SIGKILL inside
the save), so neither engine launches a third time here (4 launches, for CI time); the same faults without a
launcher are tests/training/test_save_faults.py's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hf_lora_ds.training.checkpoints import COMPLETE_MARKER, is_complete_checkpoint
from tests.e2e.launching import ENTRY, REPO, Launch, launcher, printed_lines, run, sft_args

ENGINES = {
    "zero3": (["deepspeed"], ["--deepspeed", str(REPO / "ds_configs" / "stage3.json")]),
    "fsdp2": (["accelerate", "fsdp2"], []),
}


def check_one_error_line(launch: Launch, out: Path, cause: str) -> None:
    assert launch.returncode != 0, launch.log[-3000:]
    errors = printed_lines(launch.log, "error: ")
    assert errors == [
        f"error: saving {out}/checkpoint-4 failed: {cause}; {out}/checkpoint-2 is the last complete "
        "checkpoint (--resume_from_checkpoint auto continues from it)"
    ], launch.log[-4000:]
    assert not re.search(r"^\[rank\d\]: Traceback", launch.log, flags=re.MULTILINE), launch.log[-4000:]
    assert is_complete_checkpoint(out / "checkpoint-2")
    assert not (out / "checkpoint-4" / COMPLETE_MARKER).exists()


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.timeout(1200)  # two launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_read_only_then_full_disk_during_a_save_then_resumed(engine, small_disk, tiny_model_dir, sum_data, tmp_path):
    launch_kind, engine_flags = ENGINES[engine]
    out = small_disk / "out"

    def launch(name: str, *extra: str) -> Launch:
        args = sft_args(
            tiny_model_dir,
            sum_data,
            out,
            "--dataset_cache_dir",
            str(tmp_path / "cache"),
            *engine_flags,
            *extra,
            eval_file=False,
            steps=6,
            save_steps=2,
        )
        return run(launcher(launch_kind[0], 2, *launch_kind[1:]) + [str(ENTRY)] + args, tmp_path / f"{name}.log")

    read_only = launch("read-only", "--disk_fault", "read_only", "--disk_fault_step", "3")
    check_one_error_line(read_only, out, "Read-only file system")

    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)  # the user fixes the mount
    full = launch("full", "--resume_from_checkpoint", "auto", "--disk_fault", "full", "--disk_fault_step", "3")
    assert f"resume: from {out / 'checkpoint-2'} (latest complete checkpoint" in full.log, full.log[-3000:]
    check_one_error_line(full, out, "No space left on device")
