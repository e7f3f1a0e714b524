"""run_sft.py under every launcher it supports, on CPU: each ds_config with 2 ranks under the deepspeed launcher (and
the one-GPU offload case, stage3_offload, with 1), torchrun with 2 ranks (DDP, and ZeRO-3: DeepSpeed needs no
launcher of its own), and plain python with ZeRO-3; ``--deepspeed auto`` under both multi-rank launchers, and
``--deepspeed`` given as base64 text.
Every run must exit 0, lower the loss, save an adapter that passes the integrity check, print the right world
size, give each rank its own samples, and write the before/after eval report.

Starting ranks costs more than the tiny model's run, so each launcher is started once and runs every configuration
of its cases one after another (``sft_entry.py --variant``: one ``run_sft.main`` a configuration, the process group
kept between them); each test reads its own run's output directory and its part of the log. The sample check reads
``e2e_samples_rank{R}.json``, written by the test-only ``SampleRecorder`` in sft_entry.py; the other checks read only
what run_sft.py itself leaves. run_sft.py itself, the real entry point, is launched with
``deepspeed --num_gpus 2 run_sft.py --deepspeed ds_configs/stage3.json`` by test_eval_zero3.py.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import torch

from hf_lora_ds.resources import DEEPSPEED_CONFIGS
from tests.e2e.launching import (
    CONFIGS,
    ENTRY,
    REPO,
    adapter_weights,
    check_compiler_not_imported,
    check_ok,
    check_own_samples,
    check_process_groups_released,
    check_run,
    deepspeed_shm_buffers,
    launcher,
    master_port,
    once_per_key,
    predicted_outputs,
    run,
    sft_args,
    trainer_state,
    variant_args,
    variant_logs,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test of a launcher waits for its whole launch
SHM_OP_BUILT = "deepspeed_shm_comm_op built successfully"  # what deepspeed.comm prints when its backend builds it


def config_flag(config: str) -> str:
    return f"--deepspeed {REPO / 'ds_configs' / f'{config}.json'}"


def stage3_every_parameter_partitioned(root) -> str:
    """stage3.json with no persistence threshold: its "auto" (10 x hidden) would keep the tiny model's norms whole."""
    config = json.loads((REPO / "ds_configs" / "stage3.json").read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (root / "stage3_all.json").write_text(json.dumps(config))
    return str(root / "stage3_all.json")


def launch_runs(root) -> dict[tuple[str, int], dict[str, str]]:
    """Per launcher and rank count, its runs: name -> run_sft flags. One rank under the deepspeed launcher is also
    launched by test_universal_resume (ZeRO-2 and ZeRO-3, 1 to 2 and 2 to 1 ranks); the other configs' 1-rank launches
    showed nothing their 2-rank ones do not."""
    stage2 = DEEPSPEED_CONFIGS / "stage2.json"
    return {
        ("deepspeed", 2): {
            **{config: config_flag(config) for config in CONFIGS},
            "auto": "--deepspeed auto",
            "stage3_all_checkpointed": f"--deepspeed {stage3_every_parameter_partitioned(root)} "
            "--activation_checkpointing true --eval_file=",  # training is the subject; "stage3" runs the whole job
        },
        # use_cpu as given, not resolved: accelerate makes a process group of one, which zero.Init would join as the
        # model loads, making DeepSpeed's communication there
        ("deepspeed", 1): {"stage3_offload": f"{config_flag('stage3_offload')} --use_cpu true"},
        ("torchrun", 2): {
            "ddp": "",
            "stage3": f"{config_flag('stage3')} --eval_gather_zero3_weights false",  # deepspeed x2 gathers them once
            "auto": "--deepspeed auto",
        },
        ("python", 1): {
            "stage3": config_flag("stage3"),
            "stage2_file": f"--deepspeed {stage2}",
            "stage2_base64": f"--deepspeed {base64.urlsafe_b64encode(stage2.read_bytes()).decode()}",
        },
    }


@pytest.fixture(scope="module")
def launched(tiny_model_dir, sum_data, tmp_path_factory):
    """``launched(kind, nproc)``: that launcher's one launch of all its runs (started by the first test asking), with
    its output root and rank 0's log part of each run."""
    root = tmp_path_factory.mktemp("launch-matrix")
    runs = launch_runs(root)

    def launch(kind: str, nproc: int) -> tuple[Path, dict[str, str]]:
        out = root / f"{kind}-{nproc}"
        command = launcher(kind, nproc) + [str(ENTRY), *variant_args(runs[kind, nproc])]
        launch = run(command + sft_args(tiny_model_dir, sum_data, out), root / f"{kind}-{nproc}.log")
        check_ok(launch)
        print(f"{kind} x{nproc}: {len(runs[kind, nproc])} runs in {launch.seconds:.1f} s")
        # made by accelerate (one rank) or by the package (two): neither builds the op training never calls
        assert SHM_OP_BUILT not in launch.log, "DeepSpeed's CPU shared-memory allreduce was built"
        if port := master_port(command):  # a launcher's port; python's is the package's choice, unseen here
            assert not deepspeed_shm_buffers(port), "DeepSpeed's shm allreduce buffers were left in /dev/shm"
        check_process_groups_released(out, nproc)
        check_compiler_not_imported(out, nproc)  # ZeRO imports DeepSpeed's Muon kernels: compiled only if called
        return out, variant_logs(launch.log)

    return once_per_key(launch)


CASES = [("deepspeed", 2, config) for config in CONFIGS] + [("deepspeed", 1, "stage3_offload")]
CASES += [("torchrun", 2, "ddp"), ("torchrun", 2, "stage3"), ("python", 1, "stage3")]


@pytest.mark.parametrize(("kind", "nproc", "config"), CASES, ids=[f"{k}-{n}-{c}" for k, n, c in CASES])
def test_launch(kind, nproc, config, launched, tiny_model_dir, sum_data):
    out, logs = launched(kind, nproc)
    weights = "whole" if "stage3" not in config else "layer by layer" if kind == "torchrun" else "gathered once"
    check_run(out / config, logs[config], tiny_model_dir, nproc, generation_weights=weights)
    check_own_samples(out / config, nproc, num_records=len(json.loads(sum_data["train"].read_text())))


def test_zero3_generates_the_same_with_its_weights_gathered_once_and_layer_by_layer(launched):
    """The same 2-rank ZeRO-3 run twice: under the deepspeed launcher, its evals gather the weights once; under
    torchrun, with --eval_gather_zero3_weights false, every decoding step gathers each layer."""
    (gathered, _), (layer_by_layer, _) = launched("deepspeed", 2), launched("torchrun", 2)
    for phase in ("before", "after"):
        assert predicted_outputs(gathered / "stage3", phase) == predicted_outputs(layer_by_layer / "stage3", phase)


def test_zero3_with_activation_checkpointing_and_every_parameter_partitioned(launched, tiny_model_dir):
    """PEFT + ZeRO-3 + activation checkpointing: frozen weights gathered to shape [0] on recompute used to crash."""
    out, logs = launched("deepspeed", 2)
    log = logs["stage3_all_checkpointed"]
    check_run(out / "stage3_all_checkpointed", log, tiny_model_dir, world_size=2, evaluated=False)


@pytest.mark.parametrize("kind", ["deepspeed", "torchrun"])
def test_deepspeed_auto_picks_a_shipped_config_and_trains_under_it(kind, launched):
    out, logs = launched(kind, 2)
    out, log = out / "auto", logs["auto"]
    picks = re.findall(r"--deepspeed auto: (\S+) \(the memory plan's pick\)", log)
    assert len(picks) == 1, log[-4000:]  # rank 0 only
    # Every shipped config fits this tiny model; the fastest DeepSpeed one is taken.
    assert picks[0] == str(DEEPSPEED_CONFIGS / "stage0.json")  # the package's copy (ds_configs/ links to it)
    plan_lines = [line for line in log.splitlines() if line.startswith("memory plan: ")]
    assert len(plan_lines) == 1 and plan_lines[0].startswith("memory plan: ds_configs/stage0.json without"), plan_lines
    assert trainer_state(out)["global_step"] == 4
    assert str(DEEPSPEED_CONFIGS / "stage0.json") in (out / "report.html").read_text()  # the report records the pick


def test_a_base64_config_trains_as_its_file(launched):
    out, logs = launched("python", 1)
    assert all("engine: DeepSpeed ZeRO-2" in logs[name] for name in ("stage2_file", "stage2_base64"))
    by_file, by_text = adapter_weights(out / "stage2_file"), adapter_weights(out / "stage2_base64")
    assert by_file.keys() == by_text.keys()
    for key, tensor in by_file.items():
        torch.testing.assert_close(by_text[key], tensor, rtol=0, atol=0)
