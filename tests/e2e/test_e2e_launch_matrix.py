"""run_sft.py under every launcher it supports, on CPU: each ds_config x {1, 2} ranks with the deepspeed launcher,
torchrun with 2 ranks (DDP, and ZeRO-3: DeepSpeed needs no launcher of its own), and plain python with ZeRO-3.
Every launch must exit 0, lower the loss, save an adapter that passes the integrity check, print the right world
size, give each rank its own samples, and write the before/after eval report.

The sample check reads ``e2e_samples_rank{R}.json``, written by the test-only ``SampleRecorder`` in sft_entry.py
(run_sft.main plus that callback); the other checks read only what run_sft.py itself leaves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import (
    CONFIGS,
    ENTRY,
    REPO,
    RUN_SFT,
    adapter_weights,
    check_ok,
    check_process_groups_released,
    eval_report,
    launcher,
    losses,
    rank_samples,
    run,
    sft_args,
    trainer_state,
    world_lines,
)

from hf_lora_ds.adapter import verify_adapter

STEPS, PER_DEVICE = 4, 4

CASES = [("deepspeed", nproc, config) for config in CONFIGS for nproc in (1, 2)]
CASES += [("torchrun", 2, None), ("torchrun", 2, "stage3"), ("python", 1, "stage3")]


def check_run(out, log: str, model_dir, world_size: int, evaluated: bool = True) -> None:
    state = trainer_state(out)
    assert state["global_step"] == STEPS
    loss = losses(out)
    assert len(loss) == STEPS and loss[-1] < loss[0], f"loss did not decrease: {loss}"
    verify_adapter(out, base_model=model_dir)
    check_every_lora_b_trained(out)

    (line,) = world_lines(log)  # printed once, by rank 0
    assert line.startswith(f"world size {world_size} (launcher {world_size}), rank 0,")
    batch = PER_DEVICE * world_size
    assert f"global batch {batch} = {PER_DEVICE} per device x 1 accumulation x {world_size} ranks" in line

    if evaluated:
        report = eval_report(out)
        assert set(report) == {"before", "after"}
        assert all(report[phase]["num_samples"] == 6 and report[phase]["world_size"] == world_size
                   for phase in report)  # fmt: skip


def check_every_lora_b_trained(out) -> None:
    """verify_adapter accepts a well-formed adapter that never trained; LoRA's B starts at zero, so a trained one has
    every lora_B non-zero and finite (each module got gradient through its own B)."""
    b_factors = {name: t for name, t in adapter_weights(out).items() if ".lora_B." in name}
    assert b_factors, "no lora_B tensors saved"
    untrained = sorted(name for name, tensor in b_factors.items() if not tensor.any())
    assert not untrained, f"lora_B still all zero after training: {untrained[:3]}"


def deepspeed_shm_buffers() -> set[str]:
    """Names of DeepSpeed's CPU allreduce buffers in /dev/shm (~69 MB of RAM each while they exist)."""
    shm = Path("/dev/shm")
    return {path.name for path in shm.glob("deepspeed_allreduce_buffer_*")} if shm.is_dir() else set()


def check_own_samples(out, world_size: int, num_records: int) -> None:
    """Every rank's training loader holds a disjoint share of the data, and together they hold all of it."""
    per_rank = rank_samples(out, world_size)
    shares = [set(samples) for samples in per_rank]
    assert all(len(share) == len(samples) == num_records // world_size for share, samples in zip(shares, per_rank))
    assert len(set().union(*shares)) == num_records, "ranks were given the same samples"


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "nproc", "config"), CASES, ids=[f"{k}-{n}-{c or 'ddp'}" for k, n, c in CASES])
def test_launch(kind, nproc, config, tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    extra = ["--deepspeed", str(REPO / "ds_configs" / f"{config}.json")] if config else []
    shm_before = deepspeed_shm_buffers()
    launch = run(launcher(kind, nproc) + [str(ENTRY)] + sft_args(tiny_model_dir, sum_data, out, *extra),
                 tmp_path / "launch.log")  # fmt: skip
    check_ok(launch)
    assert deepspeed_shm_buffers() <= shm_before, "DeepSpeed's shm allreduce buffers were left in /dev/shm"
    print(f"{kind} x{nproc} {config or 'ddp'}: {launch.seconds:.1f} s")
    check_run(out, launch.log, tiny_model_dir, nproc)
    check_process_groups_released(out, nproc)
    check_own_samples(out, nproc, num_records=len(json.loads(sum_data["train"].read_text())))


@pytest.mark.slow
def test_run_sft_py_itself_under_deepspeed_zero3_with_two_ranks(tiny_model_dir, sum_data, tmp_path):
    """``deepspeed --num_gpus 2 run_sft.py --deepspeed ds_configs/stage3.json --max_steps 4 --output_dir X``, with
    the real entry point: a trained adapter that reloads on the base, and world size 2 with 2 ranks."""
    out = tmp_path / "X"
    args = sft_args(tiny_model_dir, sum_data, out, "--deepspeed", "ds_configs/stage3.json", eval_file=False)
    launch = run(launcher("deepspeed", 2) + [str(RUN_SFT)] + args, tmp_path / "launch.log")
    check_ok(launch)
    check_run(out, launch.log, tiny_model_dir, world_size=2, evaluated=False)


@pytest.mark.slow
def test_zero3_with_activation_checkpointing_and_every_parameter_partitioned(tiny_model_dir, sum_data, tmp_path):
    """PEFT + ZeRO-3 + activation checkpointing: frozen weights gathered to shape [0] on recompute used to crash.
    The "auto" persistence threshold (10 x hidden) would keep the tiny model's norms whole and hide the bug."""
    config = json.loads((REPO / "ds_configs" / "stage3.json").read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (tmp_path / "stage3_all.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    args = sft_args(tiny_model_dir, sum_data, out, "--deepspeed", str(tmp_path / "stage3_all.json"),
                    "--activation_checkpointing", "true", eval_file=False)  # fmt: skip
    launch = run(launcher("deepspeed", 2) + [str(ENTRY)] + args, tmp_path / "launch.log")
    check_ok(launch)
    check_run(out, launch.log, tiny_model_dir, world_size=2, evaluated=False)
    check_process_groups_released(out, 2)
