"""``--deepspeed auto`` under both launchers with 2 CPU ranks: the memory plan picks a shipped config, the run trains
under it, and run_sft prints the plan line of the configuration it runs."""

from __future__ import annotations

import re

import pytest

from hf_lora_ds.resources import DEEPSPEED_CONFIGS
from tests.e2e.launching import RUN_SFT, check_ok, launcher, run, sft_args, trainer_state

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["deepspeed", "torchrun"])
def test_deepspeed_auto_picks_a_shipped_config_and_trains_under_it(kind, tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    args = sft_args(tiny_model_dir, sum_data, out, "--deepspeed", "auto", eval_file=False)
    launch = run(launcher(kind, 2) + [str(RUN_SFT), *args], tmp_path / "launch.log")
    check_ok(launch)

    picks = re.findall(r"--deepspeed auto: (\S+) \(the memory plan's pick\)", launch.log)
    assert len(picks) == 1, launch.log[-4000:]  # rank 0 only
    # Every shipped config fits this tiny model; the fastest DeepSpeed one is taken.
    assert picks[0] == str(DEEPSPEED_CONFIGS / "stage0.json")  # the package's copy (ds_configs/ links to it)
    plan_lines = [line for line in launch.log.splitlines() if line.startswith("memory plan: ")]
    assert len(plan_lines) == 1 and plan_lines[0].startswith("memory plan: ds_configs/stage0.json without"), plan_lines
    assert trainer_state(out)["global_step"] == 4
    report = (out / "report.html").read_text()
    assert str(DEEPSPEED_CONFIGS / "stage0.json") in report  # the run report records the pick
