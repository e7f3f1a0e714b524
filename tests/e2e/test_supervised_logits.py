"""Under 2-rank ZeRO-3 (the LM head's weight partitioned across ranks) the supervised-position loss (the fused
head-and-loss, its weight gathered and released by DeepSpeed's module hooks) must train exactly as the full-logits
loss: the same train and eval losses at every step and the same adapter, with gradient accumulation and tokens
averaged across ranks (Trainer's default). One launch trains both, one after the other (sft_entry.py --variant)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import (
    ENTRY,
    adapter_weights,
    check_every_lora_b_trained,
    check_ok,
    launcher,
    losses,
    run,
    sft_args,
    trainer_state,
    variant_args,
    variant_logs,
    world_lines,
)


@pytest.mark.slow
def test_zero3_two_ranks_supervised_logits_train_as_full_logits(tiny_model_dir, sum_data, tmp_path):
    variants = {f"supervised-{flag}": f"--supervised_logits_only {flag}" for flag in ("True", "False")}
    args = sft_args(
        tiny_model_dir,
        sum_data,
        tmp_path,
        "--deepspeed",
        "ds_configs/stage3.json",
        "--gradient_accumulation_steps",
        "2",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "2",
        "--eval_task",
        "first_token",  # the eval's loss is compared; its generation (one token) is not the subject
    )
    entry = [str(ENTRY), "--record_head_outputs", *variant_args(variants)]
    launch = run(launcher("deepspeed", 2) + entry + args, tmp_path / "launch.log")
    check_ok(launch)
    runs = {}
    for name, log in variant_logs(launch.log).items():
        out = tmp_path / name
        (world,) = world_lines(log)
        assert world.startswith("world size 2 (launcher 2), rank 0,"), world
        verify_adapter(out, base_model=tiny_model_dir)
        check_every_lora_b_trained(out)
        assert "supervised-position logits: off" not in log  # no fallback: both paths ran as asked
        assert "fused LM head loss: off" not in log  # the supervised run's head computed the loss itself
        # What the head returned on each rank: the loss itself (0 dimensions) or every position's logits (3); in
        # evaluation the accuracy callback's generation computes logits (3) beside the eval loss
        dims = 0 if name == "supervised-True" else 3
        for rank in (0, 1):
            head = json.loads((out / f"e2e_head_outputs_rank{rank}.json").read_text())
            assert head["train"] == [dims] and dims in head["eval"] and set(head["eval"]) <= {dims, 3}, (name, head)
        history = trainer_state(out)["log_history"]
        runs[name] = (
            losses(out),
            [entry["eval_loss"] for entry in history if "eval_loss" in entry],
            adapter_weights(out),
        )
    (train, evaluated, adapter), (full_train, full_evaluated, full_adapter) = (
        runs[f"supervised-{supervised}"] for supervised in ("True", "False")
    )
    assert len(train) == 4 and len(evaluated) == 2
    assert train == pytest.approx(full_train, rel=1e-5)
    assert evaluated == pytest.approx(full_evaluated, rel=1e-5)
    assert adapter.keys() == full_adapter.keys()
    for name, tensor in adapter.items():
        torch.testing.assert_close(tensor, full_adapter[name], rtol=1e-4, atol=1e-6, msg=name)
