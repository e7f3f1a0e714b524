"""A ZeRO checkpoint resumes on another number of ranks: ``--resume_from_checkpoint auto`` converts it with
DeepSpeed's ``ds_to_universal`` and the engine loads the universal checkpoint, re-partitioned.

Two launches per case, and the smallest ones that cross the rank count both ways under both partitioning schemes:
ZeRO-2 (optimizer state and gradients partitioned) written by 2 ranks and resumed by 1, ZeRO-3 (parameters too)
written by 1 rank and resumed by 2. The check is the optimizer's own state, not the adapter alone: the full fp32 LoRA
weights and both Adam moments the ZeRO optimizer holds when the resumed run begins (``EngineStateRecorder`` in
sft_entry.py, gathered over every rank's partition) must equal, tensor by tensor and exactly, what the writing run
held when it saved; and the resumed run must start at the checkpoint's step.
"""

from __future__ import annotations

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
)

CASES = [("stage2", 2, 1), ("stage3", 1, 2)]


@pytest.mark.slow
@pytest.mark.parametrize(("config", "saved_by", "resumed_by"), CASES, ids=[f"{c}-{a}to{b}" for c, a, b in CASES])
@pytest.mark.timeout(1200)  # two launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_zero_checkpoint_resumes_on_another_number_of_ranks(config, saved_by, resumed_by, tiny_model_dir, sum_data,
                                                            tmp_path):  # fmt: skip
    out = tmp_path / "out"

    def launch(nproc: int, name: str, *extra: str):
        common = ["--deepspeed", str(REPO / "ds_configs" / f"{config}.json"), "--save_strategy", "steps",
                  "--save_steps", "2", "--record_engine_state"]  # fmt: skip
        args = sft_args(tiny_model_dir, sum_data, out, *common, *extra, eval_file=False)
        return run(launcher("deepspeed", nproc) + [str(ENTRY)] + args, tmp_path / f"{name}.log")

    check_ok(launch(saved_by, "saved", "--max_steps", "2"))
    resumed = launch(resumed_by, "resumed", "--max_steps", "3", "--resume_from_checkpoint", "auto")
    check_ok(resumed)
    checkpoint = out / "checkpoint-2"
    note = (f"resume: from {checkpoint} (latest complete checkpoint); written by {saved_by} ranks, this run has "
            f"{resumed_by}: it is converted to a DeepSpeed universal checkpoint and re-partitioned")  # fmt: skip
    assert resumed.log.count(note) == 1, resumed.log[-3000:]
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
