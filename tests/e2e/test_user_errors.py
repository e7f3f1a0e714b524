"""A bad DeepSpeed config under a 2-rank launcher: one ``error:`` line (rank 0's), every rank exits 2 before any model
is loaded, and the launcher exits non-zero (deepspeed passes the 2 on; torchrun exits 1 with its own failure report).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.launching import RUN_SFT, launcher, run

pytestmark = pytest.mark.slow

CASES = {
    # Right for one rank (4 x 1 x 1) and wrong for two: the check must use the launcher's world size.
    "torchrun": (
        {"train_batch_size": 4, "zero_optimization": {"stage": 3}},
        "train_batch_size is 4 but --per_device_train_batch_size 4 x --gradient_accumulation_steps 1 x 2 ranks = 8",
        1,
    ),
    "deepspeed": ({"zero_optimisation": {"stage": 3}}, "unknown key 'zero_optimisation' (did you mean", 2),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_deepspeed_config_under_two_ranks(kind, tiny_model_dir, sum_data, tmp_path):
    config, fragment, launcher_code = CASES[kind]
    ds_config = tmp_path / "ds.json"
    ds_config.write_text(json.dumps(config))
    out = tmp_path / "out"
    args = [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--train_file",
        str(sum_data["train"]),
        "--eval_file",
        "",
        "--output_dir",
        str(out),
        "--per_device_train_batch_size",
        "4",
        "--deepspeed",
        str(ds_config),
    ]
    launch = run(launcher(kind, 2) + [str(RUN_SFT), *args], tmp_path / "launch.log")

    assert launch.returncode == launcher_code, launch.log[-4000:]
    errors = [line for line in launch.log.splitlines() if "error: " in line]
    assert len(errors) == 1 and errors[0].startswith("error: --deepspeed"), launch.log[-4000:]
    assert fragment in errors[0]
    assert 'run_sft.py", line' not in launch.log, "a rank printed a traceback"
    if kind == "torchrun":  # its report shows the first failure's code (the other rank may be SIGTERMed first)
        assert "exitcode  : 2" in launch.log, launch.log[-4000:]
    else:
        assert "exits with return code = 2" in launch.log
    assert not out.exists() or not any(out.iterdir()), "nothing may be written before the config is checked"
