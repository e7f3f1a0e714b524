"""QLoRA on the CPU (bitsandbytes' CPU backend): 4-bit and 8-bit bases train only the adapter, lower the loss, save
a verified adapter that merges into the full-precision base, evaluate before/after; bad combinations are refused
before any model is loaded.

The base is the bundled tiny Qwen2 (hidden 128, 4 layers): every linear layer is a multiple of bitsandbytes' 64-value
quantization blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import peft.helpers
import pytest
import torch
from transformers import TrainerCallback

import run_sft
from hf_lora_ds.model.merge_adapter import merge_adapter
from hf_lora_ds.model.quantization import quantization_config_from_args
from tests import REPO

pytest.importorskip("bitsandbytes")

DATA = Path(REPO, "data")
BASE = DATA / "tiny-qwen2-sum"


def raw_bytes(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's bytes: packed 4-bit weights stored as float32 hold NaN bit patterns, which never compare
    equal as floats."""
    return {name: p.detach().contiguous().view(-1).view(torch.uint8).clone() for name, p in model.named_parameters()}


class ParameterWatch(TrainerCallback):
    """Every parameter of the model as training begins and ends, and the quantized layer types it holds."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = raw_bytes(model)
        self.layer_types = {type(module).__name__ for module in model.modules()}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = raw_bytes(model)


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory) -> str:
    records = json.loads((DATA / "sum_to_x" / "eval.json").read_text(encoding="utf-8"))[:4]
    path = tmp_path_factory.mktemp("qlora-eval") / "eval.json"
    path.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return str(path)


def qlora_flags(out: Path, *extra: str, eval_file: str = "") -> list[str]:
    """Six steps on the same 4 samples (the first 4 bundled records) at a learning rate that lowers the loss on them
    within those steps; distinct batches would make the loss too noisy to say whether training works."""
    out.parent.mkdir(parents=True, exist_ok=True)
    train = out.parent / "train4.json"
    records = json.loads((DATA / "sum_to_x" / "train.json").read_text(encoding="utf-8"))[:4]
    train.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return [
        "--model_name_or_path",
        str(BASE),
        "--train_file",
        str(train),
        "--eval_file",
        eval_file,
        "--output_dir",
        str(out),
        "--dataset_cache_dir",
        str(out.parent / "cache"),
        "--max_steps",
        "6",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "2e-2",
        "--lr_scheduler_type",
        "constant",
        "--warmup_steps",
        "0",
        "--logging_steps",
        "1",
        "--disable_tqdm",
        "true",
        "--seed",
        "0",
        *extra,
    ]


def losses(out: Path) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


@pytest.mark.parametrize(
    ("flags", "layer_type"),
    [(("--load_in_4bit",), "Linear4bit"), (("--load_in_8bit", "--gradient_checkpointing", "true"), "Linear8bitLt")],
    ids=["4bit", "8bit-gradient-checkpointing"],
)
def test_quantized_base_trains_only_the_adapter(flags, layer_type, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(peft.helpers, "bnb", None)  # as a command leaves it (hf_lora_ds.command_process)
    watch = ParameterWatch()
    run_sft.main(qlora_flags(tmp_path / "run", *flags), callbacks=[watch])

    assert layer_type in watch.layer_types
    assert f"quantized base: 28 {layer_type} layers" in capsys.readouterr().out
    changed = {name for name, before in watch.before.items() if not torch.equal(before, watch.after[name])}
    assert changed, "nothing trained"
    assert all(".lora_" in name for name in changed), sorted(changed - {n for n in changed if ".lora_" in n})[:3]
    assert any(".lora_A." in name for name in changed) and any(".lora_B." in name for name in changed)
    trace = losses(tmp_path / "run")
    assert len(trace) == 6 and sum(trace[-2:]) < sum(trace[:2]), trace
    assert peft.helpers.bnb is not None  # the quantized run handed PEFT's helper the bitsandbytes it now uses


def test_qlora_adapter_evaluates_and_merges_into_the_full_precision_base(eval_file, tmp_path, capsys):
    out = tmp_path / "run"
    summary = run_sft.main(qlora_flags(out, "--load_in_4bit", "--bnb_4bit_quant_type", "fp4", eval_file=eval_file))
    assert "(4-bit fp4, double quant, compute float32)" in capsys.readouterr().out
    assert summary["before"]["num_samples"] == summary["after"]["num_samples"] == 4
    assert (out / "predictions_before.jsonl").is_file() and (out / "predictions_after.jsonl").is_file()

    merged = tmp_path / "merged"
    # The adapter goes into the float32 base, not into 4-bit weights: what is left is fp32 rounding of logits up to
    # ~20 (1.04e-3 seen with transformers 5.24; merge_adapter's own bound is 1e-4 of the largest logit).
    diff = merge_adapter(BASE, out, merged)
    assert diff < 3e-3
    config = json.loads((merged / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"


def args_for(*flags: str):
    return run_sft.parse_args(["--model_name_or_path", str(BASE), *flags])


def test_bitsandbytes_config_follows_the_training_dtype():
    assert quantization_config_from_args(args_for()) is None
    four = quantization_config_from_args(args_for("--load_in_4bit"))
    assert (four.load_in_4bit, four.bnb_4bit_quant_type, four.bnb_4bit_use_double_quant) == (True, "nf4", True)
    assert four.bnb_4bit_compute_dtype == four.bnb_4bit_quant_storage == torch.float32
    # bf16 compute is what GPUs use; the packed weights must then be stored in bf16 too for ZeRO-3 to shard them.
    half = quantization_config_from_args(
        args_for("--load_in_4bit", "--dtype", "bfloat16", "--use_cpu", "true", "--bnb_4bit_use_double_quant", "false")
    )
    assert half.bnb_4bit_compute_dtype == half.bnb_4bit_quant_storage == torch.bfloat16
    assert not half.bnb_4bit_use_double_quant
    eight = quantization_config_from_args(args_for("--load_in_8bit"))
    assert eight.load_in_8bit and not eight.load_in_4bit


def test_missing_bitsandbytes_names_the_extra(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "bitsandbytes" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ImportError, match=r"\.\[qlora\]"):
        quantization_config_from_args(args_for("--load_in_4bit"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--load_in_4bit", "--load_in_8bit"), "--load_in_4bit and --load_in_8bit"),
        (("--load_in_4bit", "--deepspeed", "ds_configs/stage3_offload.json"), "--load_in_4bit with a DeepSpeed config"),
        (("--load_in_8bit", "--deepspeed", "ds_configs/stage3_offload.json"), "--load_in_8bit with a DeepSpeed config"),
    ],
)
def test_refused_before_loading(flags, message, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ValueError, match=message):
        args_for(*flags)


@pytest.mark.parametrize("config", ["stage3.json", "stage2_offload.json"])
def test_deepspeed_configs_that_work_with_a_quantized_base_are_accepted(config, monkeypatch):
    monkeypatch.chdir(REPO)
    assert args_for("--load_in_4bit", "--deepspeed", f"ds_configs/{config}").load_in_4bit


def test_loftq_starts_at_the_full_precision_base_up_to_what_rank_r_cannot_hold():
    """Each adapted 4-bit weight Q plus its LoftQ adapter s·B·A is the full-precision W minus exactly the part of the
    quantisation error W - Q beyond rank r (its SVD tail), with LoRA's scaling s = alpha / r = 4 taken into account
    (PEFT's own fit ignores it: right only at alpha = r)."""
    from bitsandbytes.functional import dequantize_4bit
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hf_lora_ds.model.quantization import fit_loftq

    args = args_for("--load_in_4bit")
    model = AutoModelForCausalLM.from_pretrained(
        BASE, dtype=torch.float32, quantization_config=quantization_config_from_args(args), device_map={"": "cpu"}
    )
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "down_proj"]))
    assert fit_loftq(model, str(BASE)) == 8
    full = load_file(BASE / "model.safetensors")
    for name, module in model.named_modules():
        if name.endswith(("q_proj", "down_proj")):
            weight = full[name.removeprefix("base_model.model.") + ".weight"]
            packed = module.get_base_layer().weight
            error = weight - dequantize_4bit(packed.data, packed.quant_state).reshape(weight.shape)
            adapter = module.scaling["default"] * module.lora_B["default"].weight @ module.lora_A["default"].weight
            tail = torch.linalg.svdvals(error)[4:].square().sum().sqrt()
            torch.testing.assert_close(torch.linalg.norm(error - adapter), tail, rtol=1e-4, atol=0)
            assert tail < torch.linalg.norm(error)


def test_a_moe_base_says_its_fused_experts_are_not_quantized(qwen_style_tokenizer, tmp_path):
    """bitsandbytes quantizes Linear layers only: a MoE model's fused expert stacks, most of its weights, stay as
    loaded, and the quantized-base line says so instead of implying a 4-bit model."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from hf_lora_ds._testing.tiny_models import build_tiny_moe
    from hf_lora_ds.model.quantization import quantized_layers_line

    build_tiny_moe("qwen3_moe", qwen_style_tokenizer, hidden_size=64).save_pretrained(tmp_path)
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=config, device_map={"": "cpu"})
    assert quantized_layers_line(model) == (
        "quantized base: 8 Linear4bit layers (4-bit fp4, compute float32); the fused expert weights are not "
        f"({2 * 4 * (64 * 64 + 64 * 32):,} parameters stay float32): bitsandbytes quantizes Linear layers only"
    )
