"""Two runs in one process: what a run changes in other libraries for itself (DeepSpeed's kernel compile and
py-cpuinfo's ``get_cpu_info``: hf_lora_ds._compat; accelerate's process-wide state: hf_lora_ds.training.fsdp2) is
the libraries' own again after each, so a notebook that trains twice, or trains and then uses DeepSpeed, runs on
unpatched modules."""

from __future__ import annotations

from typing import Any

import cpuinfo
import pytest
import torch
from accelerate.state import AcceleratorState, PartialState
from deepspeed.runtime import compiler
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer
from hf_lora_ds.training.lora_update import one_matmul_layers
from hf_lora_ds.training.zero3_linear import lora_zero3_linear
from tests.e2e.launching import free_port
from tests.trainer.test_lora_sft_trainer import RECORDS


def library_attributes() -> dict[str, Any]:
    """Every attribute of another library a run may replace, as it is now."""
    return {
        "deepspeed.runtime.compiler.compile": compiler.compile,
        "torch.nn.functional.linear": torch.nn.functional.linear,
        "cpuinfo.get_cpu_info": cpuinfo.get_cpu_info,
        "AcceleratorState": dict(AcceleratorState._shared_state),
        "PartialState": dict(PartialState._shared_state),
    }


def launched_alone(no_launcher) -> None:
    """One process, launched: what torchrun (or run_sft alone) gives DeepSpeed."""
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        no_launcher.setenv(name, value)
    no_launcher.setenv("MASTER_PORT", str(free_port()))


def deepspeed_run(output_dir, deepspeed: str) -> SFTTrainingArguments:
    return SFTTrainingArguments(
        output_dir=str(output_dir),
        deepspeed=deepspeed,
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        lora_dropout=0.0,
        report_to="none",
        save_strategy="no",
    )


def test_after_each_of_two_deepspeed_runs_the_libraries_are_their_own(tiny_model_dir, tmp_path, no_launcher):
    launched_alone(no_launcher)
    own = {"deepspeed.runtime.compiler.compile": compiler.compile, "cpuinfo.get_cpu_info": cpuinfo.get_cpu_info}
    for run in ("first", "second"):
        # DeepSpeed's start is trimmed for the run (hf_lora_ds._compat)
        args = deepspeed_run(tmp_path / run, "stage0")
        trainer = LoraSFTTrainer(str(tiny_model_dir), args, train_dataset=RECORDS)
        assert trainer.is_deepspeed_enabled
        before = library_attributes()  # accelerate's state as the trainer's Accelerator made it
        trainer.train()
        assert library_attributes() == before, run
        assert {name: before[name] for name in own} == own, run


@pytest.mark.parametrize("loaded_by", ["the run", "the caller"])
def test_a_zero3_run_steps_with_its_own_linear_and_leaves_torch_s(loaded_by, tiny_model_dir, tmp_path, no_launcher):
    """ZeRO-3 replaces F.linear for the whole process, as the run loads the model (zero.Init) or as its engine
    partitions a model the caller loaded: the run's steps use the package's ZeRO-3 linear
    (hf_lora_ds.training.zero3_linear), and F.linear is torch's again once the trainer is built and after training
    (a ZeRO-3 run left DeepSpeed's in the caller's process). Its LoRA layers keep PEFT's form of the update, whose
    lora_B call gathers the weight: left out by the config, and by ZeRO-3's hooks where a list still names them."""
    launched_alone(no_launcher)
    original = torch.nn.functional.linear
    model, tokenizer = str(tiny_model_dir), None
    if loaded_by == "the caller":
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = deepspeed_run(tmp_path, "stage3")
    trainer = LoraSFTTrainer(model, args, train_dataset=RECORDS, processing_class=tokenizer)
    assert torch.nn.functional.linear is original
    assert trainer.one_matmul_layers == []
    trainer.one_matmul_layers = one_matmul_layers(trainer.model, partitioned=False)
    forms = []
    for layer in trainer.one_matmul_layers:
        layer.register_forward_pre_hook(lambda module, args: forms.append(bool(module.lora_variant)))
    in_forward = []
    first_mlp = trainer.model.get_base_model().model.layers[0].mlp
    first_mlp.register_forward_pre_hook(lambda *_: in_forward.append(torch.nn.functional.linear))
    trainer.train()
    assert torch.nn.functional.linear is original
    assert in_forward and all(linear is lora_zero3_linear for linear in in_forward)
    assert forms and not any(forms)
