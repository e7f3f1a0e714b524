"""Mixture-of-Experts models launched as users launch them, on 2 CPU ranks: ZeRO-2 with evaluation during and after
training, ZeRO-3 and its resume from a checkpoint, ``--deepspeed auto`` (one deepspeed launch, sft_entry.py
--variant), and FSDP2 under torchrun. Tiny Qwen3-MoE (fused experts) and DeepSeek-V3 (a dense first layer, a shared
expert, grouped routing) models; every adapter holds LoRA for every routed expert of every MoE layer, as many
parameters as rank x (in + out) per expert says (an adapter that left the experts out is a fraction of that size:
axolotl #3515), every lora_B trained. One-process runs of every family: tests/cli/test_run.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_lora_ds._testing.tiny_models import build_tiny_moe
from hf_lora_ds.model.adapter_check import verify_adapter
from hf_lora_ds.model.experts import moe_blocks
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_every_lora_b_trained,
    check_in_run_eval,
    check_ok,
    eval_report,
    launcher,
    losses,
    printed_lines,
    recorded_steps,
    run,
    sft_args,
    trainer_state,
    variant_args,
    variant_logs,
)

pytestmark = pytest.mark.slow
LORA_RANK = 8  # run_sft's default


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, qwen_style_tokenizer):
    dirs = {}
    for family in ("qwen3_moe", "deepseek_v3"):
        path = tmp_path_factory.mktemp(family)
        build_tiny_moe(family, qwen_style_tokenizer).save_pretrained(path)
        qwen_style_tokenizer.save_pretrained(path)
        dirs[family] = path
    return dirs


def expected_expert_parameters(model_dir) -> int:
    """LoRA parameters the routed experts must hold: for every fused expert weight (experts, out, in) of every MoE
    layer, each expert's own A (rank x in) and B (out x rank)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    weights = dict(model.named_parameters())
    total = 0
    for block in moe_blocks(model):
        for name in block.fused_parameters():
            experts, out_features, in_features = weights[name].shape
            total += experts * LORA_RANK * (in_features + out_features)
    return total


def check_experts_trained(out, model_dir) -> None:
    """The adapter verified against its base, every lora_B trained, and the routed experts' LoRA whole."""
    verify_adapter(out, base_model=model_dir)
    check_every_lora_b_trained(out)
    experts = {name: t for name, t in adapter_weights(out).items() if ".experts." in name}
    assert sum(t.numel() for t in experts.values()) == expected_expert_parameters(model_dir), sorted(experts)


@pytest.mark.timeout(900)  # four runs in one launch
def test_zero2_zero3_resume_and_auto_on_two_ranks(moe_dirs, sum_data, tmp_path):
    out = tmp_path / "deepspeed"
    qwen3, deepseek = moe_dirs["qwen3_moe"], moe_dirs["deepseek_v3"]
    variants = {
        "zero2": "--deepspeed stage2 --eval_strategy steps --eval_steps 2 --eval_task first_token",
        "zero3": f"--deepspeed stage3 --model_name_or_path {deepseek} --save_strategy steps --save_steps 2",
        "zero3_resumed": f"--deepspeed stage3 --model_name_or_path {deepseek} --save_strategy steps --save_steps 2 "
        f"--resume_from_checkpoint {out / 'zero3' / 'checkpoint-2'}",
        "auto": "--deepspeed auto",
    }
    args = sft_args(qwen3, sum_data, out, "--lora_dropout", "0.1")  # dropout on the Linear adapters only
    launch = run(launcher("deepspeed", 2) + [str(ENTRY), *variant_args(variants)] + args, tmp_path / "launch.log")
    check_ok(launch)
    logs = variant_logs(launch.log)
    for name, model_dir in (("zero2", qwen3), ("zero3", deepseek), ("zero3_resumed", deepseek), ("auto", qwen3)):
        check_experts_trained(out / name, model_dir)
        assert set(eval_report(out / name)) == {"before", "after"}, name
        (experts_line,) = printed_lines(logs[name], "experts: LoRA on ")
        assert "router not adapted" in experts_line and "on the other adapters only" in experts_line, experts_line
    check_in_run_eval(out / "zero2", [2, 4])
    # Resumed at step 2 of the same run: steps 3 and 4 and the adapter as if never stopped (ZeRO-3's partitioned
    # expert adapters and their Adam moments restored)
    assert trainer_state(out / "zero3_resumed")["global_step"] == 4
    assert recorded_steps(out / "zero3_resumed", 2) == [{"start": 2, "completed": [3, 4]}] * 2
    assert losses(out / "zero3_resumed")[2:] == pytest.approx(losses(out / "zero3")[2:], rel=1e-5)
    resumed, whole = adapter_weights(out / "zero3_resumed"), adapter_weights(out / "zero3")
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    (picked,) = printed_lines(logs["auto"], "--deepspeed auto: ")
    assert picked.endswith("(the memory plan's pick)"), picked


def test_fsdp2_on_two_ranks(moe_dirs, sum_data, tmp_path):
    out = tmp_path / "fsdp"
    fsdp = ["--fsdp", "full_shard", "--fsdp_config", str(REPO / "fsdp_configs" / "fsdp2.json")]
    args = sft_args(moe_dirs["qwen3_moe"], sum_data, out, *fsdp, eval_file=False)
    launch = run(launcher("torchrun", 2) + [str(ENTRY)] + args, tmp_path / "fsdp.log")
    check_ok(launch)
    (engine,) = printed_lines(launch.log, "engine: ")
    assert engine.startswith("engine: FSDP2"), engine
    check_experts_trained(out, moe_dirs["qwen3_moe"])
