"""FSDP2 under the configurations users run, on 2 CPU ranks, through ``accelerate launch --config_file`` with the
shipped ``accelerate_configs/fsdp2.yaml`` as a CPU user runs it (``use_cpu: true``): the final adapter and every
checkpoint's adapter saved whole and non-zero, the same bit for bit for FULL_STATE_DICT and SHARDED_STATE_DICT, and
an exact resume from a FULL_STATE_DICT checkpoint (which hung before the fix; resuming the shipped SHARDED config is
test_resume.py's).

Axes, paired to keep CI time down (3 launches): the state dict type (FULL / SHARDED) with CPU-RAM-efficient loading
(on/off: the FULL run loads with it, the SHARDED run without). Both end as the default job does, with the accuracy
before and after (generation under FSDP2), and an accuracy eval during training. Trainer's own ``--fsdp --fsdp_config``
form is test_fsdp.py's. The other two axes the issue names cannot run on a CPU: parameter offload (torch's
CPUOffloadPolicy moves parameters between an accelerator and host memory) and QLoRA (bitsandbytes' 4-bit weights cannot
be split into FSDP2's DTensor shards); both are refused before the model loads, with one line (the last test launches
the offload config).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_every_lora_b_trained,
    check_in_run_eval,
    check_ok,
    check_whole_job,
    launcher,
    printed_lines,
    recorded_steps,
    run,
    sft_args,
    trainer_state,
)

STEPS = 4
# State dict type -> CPU-RAM-efficient loading of its run.
RUNS = {"FULL_STATE_DICT": True, "SHARDED_STATE_DICT": False}


def accelerate_config(tmp_path: Path, state_dict_type: str, efficient: bool, **fsdp: object) -> Path:
    """The shipped ``accelerate_configs/fsdp2.yaml`` as a CPU user runs it: ``use_cpu: true``, and the values asked."""
    config = yaml.safe_load((REPO / "accelerate_configs" / "fsdp2.yaml").read_text())
    config["use_cpu"] = True
    config["fsdp_config"].update(
        fsdp_state_dict_type=state_dict_type,
        fsdp_cpu_ram_efficient_loading=efficient,
        **{f"fsdp_{key}": value for key, value in fsdp.items()},
    )
    path = tmp_path / f"fsdp2-{state_dict_type}-{efficient}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(state_dict_type: str, out: Path, tiny_model_dir, sum_data, tmp_path, *extra, evaluated: bool = False):
    args = sft_args(tiny_model_dir, sum_data, out, *extra, eval_file=evaluated, steps=STEPS, save_steps=2)
    command = launcher("accelerate", 2, accelerate_config(tmp_path, state_dict_type, RUNS[state_dict_type]))
    return run(command + [str(ENTRY)] + args, tmp_path / f"{out.name}.log")


def check_saved_whole(out: Path, model_dir: Path) -> None:
    """The final adapter and each checkpoint's: every tensor present with its full shape, every lora_B trained."""
    for saved in (out, out / "checkpoint-2", out / "checkpoint-4"):
        verify_adapter(saved, base_model=model_dir)
        check_every_lora_b_trained(saved)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_full_and_sharded_state_dicts_save_the_same_adapter_and_full_resumes(tiny_model_dir, sum_data, tmp_path):
    outs = {kind: tmp_path / kind.lower() for kind in RUNS}
    for kind, efficient in RUNS.items():
        # With efficient loading rank 0's weights are broadcast: rank 1's own copy, offset by 1, must not matter.
        offset = ["--offset_loaded_weights", "1"] if efficient else []
        # Both evaluate during training too: an eval draws random numbers, so the two runs must evaluate alike.
        in_run_eval = ["--eval_strategy", "steps", "--eval_steps", "2"]
        trained = launch(kind, outs[kind], tiny_model_dir, sum_data, tmp_path, *offset, *in_run_eval, evaluated=True)
        check_ok(trained)
        (engine,) = printed_lines(trained.log, "engine: ")
        assert engine.startswith("engine: FSDP2 (full shard of "), engine
        check_saved_whole(outs[kind], tiny_model_dir)
        check_whole_job(outs[kind], trained.log, world_size=2)  # generation under FSDP2 (hf_lora_ds.eval.generation)
        check_in_run_eval(outs[kind], steps=[2, 4])

    full, sharded = outs["FULL_STATE_DICT"], outs["SHARDED_STATE_DICT"]
    assert (full / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()  # FULL: one adapter-only file (rank 0's)
    assert (sharded / "checkpoint-2" / "pytorch_model_fsdp_0").is_dir()  # SHARDED: torch.distributed.checkpoint
    for saved in ("", "checkpoint-2", "checkpoint-4"):
        expected, got = adapter_weights(sharded / saved), adapter_weights(full / saved)
        assert expected.keys() == got.keys()
        assert all(torch.equal(got[name], expected[name]) for name in expected), saved or "final adapter"

    # Resume from the FULL run's checkpoint-2 (checkpoint-4 set aside): steps 3 and 4 only, ending on the same adapter.
    resumed = tmp_path / "full-resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    again = launch("FULL_STATE_DICT", resumed, tiny_model_dir, sum_data, tmp_path, "--resume_from_checkpoint", "auto")
    check_ok(again)
    assert f"resume: from {resumed / 'checkpoint-2'} (latest complete checkpoint)" in again.log
    assert recorded_steps(resumed, 2) == [{"start": 2, "completed": [3, 4]}] * 2
    assert trainer_state(resumed)["global_step"] == STEPS
    expected, got = adapter_weights(full), adapter_weights(resumed)
    assert all(torch.equal(got[name], expected[name]) for name in expected), "FULL_STATE_DICT resumed"


@pytest.mark.slow
def test_parameter_offload_is_refused_in_one_line_on_a_cpu(tiny_model_dir, sum_data, tmp_path):
    """The Accelerate config with ``fsdp_offload_params: true``: one line from rank 0, before the model loads (the
    QLoRA refusal is the same check's, tests/launch/test_arguments.py)."""
    config = accelerate_config(tmp_path, "FULL_STATE_DICT", False, offload_params=True)
    out = tmp_path / "out"
    refused = run(
        launcher("accelerate", 2, config) + [str(ENTRY)] + sft_args(tiny_model_dir, sum_data, out, eval_file=False),
        tmp_path / "refused.log",
    )
    assert refused.returncode != 0
    errors = printed_lines(refused.log, "error: ")
    assert errors == [
        "error: FSDP cpu_offload moves parameters from an accelerator to host memory, and this machine "
        "has none: drop cpu_offload (fsdp_configs/fsdp2.json)"
    ], refused.log[-3000:]
    # The launcher reports the failed ranks with a traceback of its own; the ranks themselves print none.
    assert not re.search(r"^\[rank\d\]: Traceback", refused.log, flags=re.MULTILINE), refused.log[-3000:]
    assert "engine:" not in refused.log and not out.exists(), "refused only after the model was loaded"
