"""Under 2-rank ZeRO-3 (the LM head's weight partitioned across ranks) the supervised-position loss (the fused
head-and-loss, its weight gathered and released by DeepSpeed's module hooks) must train exactly as the full-logits
loss: the same train and eval losses at every step and the same adapter, with gradient accumulation and tokens
averaged across ranks (Trainer's default). Both launch run_sft.py itself, the real entry point, as the README does."""

from __future__ import annotations

import pytest
import torch

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import (
    RUN_SFT,
    adapter_weights,
    check_every_lora_b_trained,
    check_ok,
    launcher,
    losses,
    run,
    sft_args,
    trainer_state,
    world_lines,
)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_zero3_two_ranks_supervised_logits_train_as_full_logits(tiny_model_dir, sum_data, tmp_path):
    runs = {}
    for supervised in ("True", "False"):
        out = tmp_path / f"supervised-{supervised}"
        args = sft_args(tiny_model_dir, sum_data, out, "--deepspeed", "ds_configs/stage3.json",
                        "--gradient_accumulation_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2",
                        "--supervised_logits_only", supervised, eval_file=True)  # fmt: skip
        launch = run(launcher("deepspeed", 2) + [str(RUN_SFT)] + args, tmp_path / f"launch-{supervised}.log")
        check_ok(launch)
        # The real entry point as a user launches it (the launch matrix's launches go through sft_entry.py).
        (world,) = world_lines(launch.log)
        assert world.startswith("world size 2 (launcher 2), rank 0,"), world
        verify_adapter(out, base_model=tiny_model_dir)
        check_every_lora_b_trained(out)
        assert "supervised-position logits: off" not in launch.log  # no fallback: both paths ran as asked
        assert "fused LM head loss: off" not in launch.log  # the supervised run's head computed the loss itself
        history = trainer_state(out)["log_history"]
        runs[supervised] = (losses(out), [entry["eval_loss"] for entry in history if "eval_loss" in entry],
                            adapter_weights(out))  # fmt: skip
    (train, evaluated, adapter), (full_train, full_evaluated, full_adapter) = runs["True"], runs["False"]
    assert len(train) == 4 and len(evaluated) == 2
    assert train == pytest.approx(full_train, rel=1e-5)
    assert evaluated == pytest.approx(full_evaluated, rel=1e-5)
    assert adapter.keys() == full_adapter.keys()
    for name, tensor in adapter.items():
        torch.testing.assert_close(tensor, full_adapter[name], rtol=1e-4, atol=1e-6, msg=name)
