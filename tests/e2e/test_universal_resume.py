"""A ZeRO checkpoint resumes on another number of ranks: ``--resume_from_checkpoint auto`` converts it with
DeepSpeed's ``ds_to_universal`` and the engine loads the universal checkpoint, re-partitioned.

The smallest runs that cross the rank count both ways under both partitioning schemes: ZeRO-2 (optimizer state and
gradients partitioned) written by 2 ranks and resumed by 1, ZeRO-3 (parameters too) written by 1 rank and resumed by 2,
in three launches (the 2-rank one writes ZeRO-2 and resumes ZeRO-3). The check is the optimizer's own state, not the
adapter alone: the full fp32 LoRA weights and both Adam moments the ZeRO optimizer holds when the resumed run begins
(``EngineStateRecorder`` in sft_entry.py, gathered over every rank's partition) must equal, tensor by tensor and
exactly, what the writing run held when it saved; and the resumed run must start at the checkpoint's step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_lora_ds.training.universal_checkpoint import UNIVERSAL_MARKER
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_ok,
    launcher,
    recorded_steps,
    run,
    sft_args,
    trainer_state,
    variant_args,
    variant_logs,
)

CASES = [("stage2", 2, 1), ("stage3", 1, 2)]


@pytest.fixture(scope="module")
def universal_runs(tiny_model_dir, sum_data, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Three launches (``sft_entry.py --variant``, one run a configuration): 1 rank saves ZeRO-3; 2 ranks save ZeRO-2
    and resume ZeRO-3; 1 rank resumes ZeRO-2. Each run's output is ``root/CONFIG``; rank 0's resumed-run logs."""
    root, resumed_logs = tmp_path_factory.mktemp("universal"), {}

    def launch(nproc: int, name: str, variants: dict[str, str]) -> str:
        args = sft_args(
            tiny_model_dir,
            sum_data,
            root,
            "--save_strategy",
            "steps",
            "--save_steps",
            "2",
            "--record_engine_state",
            eval_file=False,
        )
        launched = run(
            launcher("deepspeed", nproc) + [str(ENTRY), *variant_args(variants)] + args, root / f"{name}.log"
        )
        check_ok(launched)
        return launched.log

    def saves(config: str) -> str:
        return f"--deepspeed {REPO / 'ds_configs' / f'{config}.json'} --max_steps 2"

    def resumes(config: str) -> str:
        return f"--deepspeed {REPO / 'ds_configs' / f'{config}.json'} --max_steps 3 --resume_from_checkpoint auto"

    launch(1, "saved-1", {"stage3": saves("stage3")})
    resumed_logs["stage3"] = variant_logs(
        launch(2, "saved-2-resumed-2", {"stage2": saves("stage2"), "stage3": resumes("stage3")})
    )["stage3"]
    resumed_logs["stage2"] = variant_logs(launch(1, "resumed-1", {"stage2": resumes("stage2")}))["stage2"]
    return root, resumed_logs


@pytest.mark.slow
@pytest.mark.parametrize(("config", "saved_by", "resumed_by"), CASES, ids=[f"{c}-{a}to{b}" for c, a, b in CASES])
@pytest.mark.timeout(1800)  # the first case waits for the three launches, LAUNCH_TIMEOUT_S (600 s) at most each
def test_zero_checkpoint_resumes_on_another_number_of_ranks(config, saved_by, resumed_by, universal_runs):
    root, resumed_logs = universal_runs
    out, log = root / config, resumed_logs[config]
    checkpoint = out / "checkpoint-2"
    note = (
        f"resume: from {checkpoint} (latest complete checkpoint); written by {saved_by} ranks, this run has "
        f"{resumed_by}: it is converted to a DeepSpeed universal checkpoint and re-partitioned"
    )
    assert log.count(note) == 1, log[-3000:]
    assert (checkpoint / "global_step2_universal" / UNIVERSAL_MARKER).is_file()
    # Every rank starts at the checkpoint's step and trains on from there.
    assert recorded_steps(out, resumed_by) == [{"start": 2, "completed": [3]}] * resumed_by
    assert trainer_state(out)["global_step"] == 3

    saved = torch.load(out / "e2e_engine_state_save_step2.pt")
    loaded = torch.load(out / "e2e_engine_state_resumed_step2.pt")
    assert saved.keys() == loaded.keys() and len(saved) == 28  # 7 adapted linears x 2 layers x (lora_A, lora_B)
    for name, state in saved.items():
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            assert state[key].abs().sum() > 0, (name, key)  # trained state, not zeros that would match anything
            assert torch.equal(loaded[name][key], state[key]), (name, key)
    # The weights the writing run saved in its adapter are the ones the resumed optimizer starts from.
    adapter = adapter_weights(checkpoint)
    for name, state in saved.items():
        torch.testing.assert_close(adapter[name.replace(".default", "")], state["fp32"], rtol=0, atol=0)
