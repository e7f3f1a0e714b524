"""run_sft.py under ``accelerate launch --config_file`` with each shipped DeepSpeed Accelerate config, 2 CPU ranks.

The run must really use the DeepSpeed setup the Accelerate config names (its ``engine:`` line is read from the live
DeepSpeed engine, its memory plan line from the resolved config), write a ZeRO checkpoint with every rank's
partition, save a trained adapter and end as the default job does: accuracy before and after (and, under ZeRO-3, an
accuracy eval during training too). ZeRO-3 + CPU offload is the PEFT guide's ``ds_zero3_cpu.yaml``; a 4-bit base
under it is refused before loading, exactly as under ``--deepspeed ds_configs/stage3_offload.json``. The shipped
FSDP2 config is launched (and resumed) by test_resume.py.
"""

from __future__ import annotations

import re

import pytest

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import (
    ENTRY,
    RUN_SFT,
    adapter_weights,
    check_in_run_eval,
    check_ok,
    check_whole_job,
    launcher,
    losses,
    printed_lines,
    run,
    sft_args,
    trainer_state,
)

CASES = {
    "zero2": ("DeepSpeed ZeRO-2", "stage2"),
    "zero3": ("DeepSpeed ZeRO-3", "stage3"),
    "zero3_offload": ("DeepSpeed ZeRO-3 (offload optimizer cpu, parameters cpu)", "stage3_offload"),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CASES))
def test_accelerate_deepspeed_config_is_the_engine_of_the_run(config, tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    in_run_eval = ["--eval_strategy", "steps", "--eval_steps", "2"] if config == "zero3" else []
    args = sft_args(tiny_model_dir, sum_data, out, *in_run_eval, steps=2, save_steps=2)
    launch = run(launcher("accelerate", 2, config) + [str(ENTRY)] + args, tmp_path / "run.log")
    check_ok(launch)
    check_whole_job(out, launch.log, world_size=2)
    if in_run_eval:
        check_in_run_eval(out, steps=[2])

    engine, _ = CASES[config]
    (line,) = printed_lines(launch.log, "engine: ")  # rank 0 only, once
    assert line.startswith(f"engine: {engine}, world size 2, backend gloo"), line
    (plan,) = printed_lines(launch.log, "memory plan: ")
    zero = engine.removeprefix("DeepSpeed ").replace(" (offload", ", offload").rstrip(")")
    assert plan.startswith(f"memory plan: DeepSpeed {zero} without gradient checkpointing"), plan
    recorded = [entry["engine"] for entry in trainer_state(out)["log_history"] if "engine" in entry]
    assert recorded == [line.removeprefix("engine: ")]

    partitions = sorted(path.name for path in (out / "checkpoint-2" / "global_step2").glob("*optim_states.pt"))
    assert len(partitions) == 2 and all(f"zero_pp_rank_{rank}_" in partitions[rank] for rank in (0, 1)), partitions
    assert len(losses(out)) == 2
    verify_adapter(out, base_model=tiny_model_dir)
    lora_b = [weight for name, weight in adapter_weights(out).items() if "lora_B" in name]
    assert lora_b and all(weight.abs().sum() > 0 for weight in lora_b), "an untrained lora_B in the saved adapter"


# The refusal a user meets under the PEFT guide's offload config: the same as under --deepspeed
# ds_configs/stage3_offload.json. A --deepspeed flag that disagrees with the Accelerate config is refused at the same
# boundary before loading; its message, from the variables accelerate exports, is tested in
# tests/launch/test_accelerate_launch.py.
REFUSED_4BIT = (
    "--load_in_4bit with a DeepSpeed config that offloads parameters (DeepSpeed ZeRO-3, offload optimizer "
    "cpu, parameters cpu)"
)


@pytest.mark.slow
def test_a_4bit_base_is_refused_under_the_offload_config_before_loading(tiny_model_dir, sum_data, tmp_path):
    args = sft_args(tiny_model_dir, sum_data, tmp_path / "out", "--load_in_4bit", "true", eval_file=False)
    launch = run(launcher("accelerate", 2, "zero3_offload") + [str(RUN_SFT)] + args, tmp_path / "run.log")
    assert launch.returncode != 0
    errors = printed_lines(launch.log, "error: ")
    assert len(errors) == 1 and REFUSED_4BIT in errors[0], errors
    # The launcher reports the failed ranks with a traceback of its own; the ranks themselves print none.
    assert not re.search(r"^\[rank\d\]: Traceback", launch.log, flags=re.MULTILINE)
    assert "Loading weights" not in launch.log
