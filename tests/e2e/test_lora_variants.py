"""LoRA variants launched as users launch them, two steps each, every run in one 2-rank deepspeed launch
(tests/e2e/sft_entry.py --variant: starting 2 ranks costs more than two steps of the demo model): PiSSA (with the
before/after eval), OLoRA, EVA and CorDA under ZeRO-3, LoftQ on a 4-bit base under ZeRO-3, LoRA+ under ZeRO-2, LoRA-FA
under ZeRO-0. ZeRO-3 is where the inits can break (each rank holds a slice of every weight when PEFT wraps the model);
torchrun's DDP wraps after the init, as one process does.

Each run's saved adapter, loaded on the base as a user loads it (the ORIGINAL weights: PiSSA, OLoRA and CorDA trained on
a residual PEFT had rewritten; the 4-bit base for LoftQ), gives the logits the trained model gave at the end of its own
run (``--record_logits``), to fp32 rounding. One-process runs of every init: tests/trainer/test_lora_sft_trainer.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import ENTRY, REPO, check_ok, eval_report, launcher, run, sft_args, trainer_state

pytestmark = pytest.mark.slow
BASE = REPO / "data" / "tiny-qwen2-sum"  # hidden 128: bitsandbytes' 64-value blocks fit every layer
LEARNING_RATE = 2e-3


def launch_variants(kind: str, variants: dict[str, str], sum_data, tmp_path):
    out = tmp_path / kind
    args = sft_args(
        BASE,
        sum_data,
        out,
        "--max_steps",
        "2",
        "--learning_rate",
        str(LEARNING_RATE),
        "--lora_dropout",
        "0",
        "--lora_init_samples",
        "16",
        eval_file=False,
    )
    choices = [option for name, extra in variants.items() for option in ("--variant", f"{name}:{extra}")]
    launch = run(launcher(kind, 2) + [str(ENTRY), "--record_logits", *choices] + args, tmp_path / f"{kind}.log")
    check_ok(launch)
    print(f"{kind}: {len(variants)} runs of 2 steps in one 2-rank launch: {launch.seconds:.0f} s")
    return out, launch.log


def check_saved_adapter(out, rank: int, quantized: bool = False) -> dict:
    """Two steps trained; the adapter verified, plain LoRA of ``rank``, giving the trained model's logits."""
    assert trainer_state(out)["global_step"] == 2
    verify_adapter(out, base_model=BASE)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["init_lora_weights"], config["eva_config"]) == (rank, True, None)
    recorded = torch.load(out / "e2e_logits.pt")
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_quant_storage=torch.float32,
    )
    base = AutoModelForCausalLM.from_pretrained(
        BASE, dtype=torch.float32, device_map={"": "cpu"}, quantization_config=quantization if quantized else None
    )
    with torch.no_grad():
        logits = PeftModel.from_pretrained(base, str(out)).eval()(input_ids=recorded["input_ids"]).logits
    scale = recorded["logits"].abs().max()
    assert (logits - recorded["logits"]).abs().max() <= 1e-4 * scale, "the saved adapter is not the trained model"
    return {**config, "group_lrs": recorded["group_lrs"]}


def check_phases_see(out) -> None:
    """The before eval saw the original base (PiSSA rewrote it to a residual; the adapter's start, set back on every
    rank's partition, restores it), the after eval the trained model."""
    ids = torch.load(out / "e2e_logits.pt")["input_ids"]
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()(input_ids=ids).logits
    before, after = torch.load(out / "e2e_logits_before.pt"), torch.load(out / "e2e_logits_after.pt")
    tolerance = 1e-4 * base.abs().max()
    assert (before - base).abs().max() <= tolerance, "the before eval did not see the original base"
    assert (after - base).abs().max() > 10 * tolerance, "the after eval saw the base, not the trained model"
    torch.testing.assert_close(after, torch.load(out / "e2e_logits.pt")["logits"], rtol=1e-4, atol=1e-5)


def test_deepspeed_variants(sum_data, tmp_path):
    pytest.importorskip("bitsandbytes")
    out, log = launch_variants(
        "deepspeed",
        {
            # the before/after eval (the base before, PiSSA's rewritten base restored); one token is enough for it
            "pissa": f"--lora_init pissa --deepspeed stage3 --eval_file {sum_data['eval']} --eval_task first_token "
            "--record_phase_logits",
            "olora": "--lora_init olora --deepspeed stage3",
            "eva": "--lora_init eva --deepspeed stage3",
            "corda": "--lora_init corda --deepspeed stage3",
            "loftq": "--lora_init loftq --load_in_4bit --deepspeed stage3",
            "loraplus": "--lora_optimizer loraplus --loraplus_lr_ratio 8 --deepspeed stage2",
            "lorafa": "--lora_optimizer lorafa --deepspeed stage0",
        },
        sum_data,
        tmp_path,
    )
    for converted in ("pissa", "olora", "corda"):
        check_saved_adapter(out / converted, rank=16)
    assert set(eval_report(out / "pissa")) == {"before", "after"}
    check_phases_see(out / "pissa")
    assert check_saved_adapter(out / "eva", rank=8)["rank_pattern"]  # EVA moved rank between modules
    check_saved_adapter(out / "loftq", rank=8, quantized=True)
    assert check_saved_adapter(out / "loraplus", rank=8)["group_lrs"] == [LEARNING_RATE, 8 * LEARNING_RATE]
    assert check_saved_adapter(out / "lorafa", rank=8)["group_lrs"] == [LEARNING_RATE]
    for line in (
        "LoRA init pissa; adapter converted at the end to plain LoRA of rank 16",
        "LoRA init loftq",
        "LoRA+: B at 8x the learning rate of A",
        "LoRA-FA: A frozen, only B trains",
    ):
        assert line in log
