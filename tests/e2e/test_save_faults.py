"""A disk that fills up while a 2-rank ZeRO-3 run writes a checkpoint: the run stops with one line naming the
checkpoint, the cause and the last complete checkpoint (printed by whichever rank failed), checkpoint-2 stays complete,
and once space is freed ``--resume_from_checkpoint auto`` continues from it on both ranks. A SIGKILL inside a 2-rank
ZeRO-3 save is test_resume.py's; the same faults without DeepSpeed are tests/training/test_save_faults.py's."""

from __future__ import annotations

import re
import textwrap

import pytest

from hf_lora_ds.training.checkpoints import COMPLETE_MARKER
from tests.e2e.launching import ENTRY, REPO, check_ok, launcher, recorded_steps, run, sft_args

# run_sft.py behind its own error boundary, plus a callback that fills the file system as step 3 begins (after
# checkpoint-2 is complete), leaving less room than any rank's part of checkpoint-4 needs.
FILL_AFTER_CHECKPOINT_2 = """
import os, sys
sys.path.insert(0, {repo!r})
from transformers import TrainerCallback
import run_sft
from hf_lora_ds.errors import run_cli

class FillDisk(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 2 and args.process_index == 0:
            stats = os.statvfs(args.output_dir)
            with open(os.path.join(args.output_dir, os.pardir, "filler"), "wb") as filler:
                filler.write(b"0" * (stats.f_bavail * stats.f_frsize - 64 * 1024))

run_cli(lambda: run_sft.main(sys.argv[1:], callbacks=[FillDisk()]))
"""


@pytest.mark.slow
def test_zero3_full_disk_during_a_save_then_resumed(small_disk, tiny_model_dir, sum_data, tmp_path):
    out = small_disk / "out"
    script = tmp_path / "fill_disk_entry.py"
    script.write_text(textwrap.dedent(FILL_AFTER_CHECKPOINT_2.format(repo=str(REPO))))
    common = ["--max_steps", "6", "--save_strategy", "steps", "--save_steps", "2",
              "--deepspeed", str(REPO / "ds_configs" / "stage3.json")]  # fmt: skip
    full = run(launcher("deepspeed", 2) + [str(script)] + sft_args(tiny_model_dir, sum_data, out, *common,
               "--dataset_cache_dir", str(tmp_path / "cache"), eval_file=False), tmp_path / "full.log")  # fmt: skip
    assert full.returncode != 0, full.log[-3000:]
    errors = re.findall(r"^error: .*$", full.log, flags=re.MULTILINE)
    assert errors and all(re.fullmatch(
        rf"error: (\(rank \d\) )?saving {out}/checkpoint-4\S* failed: No space left on device; {out}/checkpoint-2 is "
        r"the last complete checkpoint \(--resume_from_checkpoint auto continues from it\)", line) for line in errors
    ), full.log[-4000:]  # fmt: skip
    assert not re.search(r"^\[rank\d\]: Traceback", full.log, flags=re.MULTILINE), full.log[-4000:]
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert not (out / "checkpoint-4" / COMPLETE_MARKER).exists()

    (small_disk / "filler").unlink()  # the user frees space
    args = sft_args(tiny_model_dir, sum_data, out, *common, "--dataset_cache_dir", str(tmp_path / "cache"),
                    "--resume_from_checkpoint", "auto", eval_file=False)  # fmt: skip
    resumed = run(launcher("deepspeed", 2) + [str(ENTRY)] + args, tmp_path / "resumed.log")
    check_ok(resumed)
    assert f"resume: from {out / 'checkpoint-2'} (latest complete checkpoint; skipped incomplete checkpoint-4)" in (
        resumed.log
    )
    assert recorded_steps(out, 2) == [{"start": 2, "completed": [3, 4, 5, 6]}] * 2
