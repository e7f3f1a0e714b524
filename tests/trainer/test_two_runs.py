"""Two runs in one process: what a run changes in other libraries for itself (DeepSpeed's kernel compile and
py-cpuinfo's ``get_cpu_info``: hf_lora_ds._compat; accelerate's process-wide state: hf_lora_ds.training.fsdp2) is
the libraries' own again after each, so a notebook that trains twice, or trains and then uses DeepSpeed, runs on
unpatched modules."""

from __future__ import annotations

from typing import Any

import cpuinfo
from accelerate.state import AcceleratorState, PartialState
from deepspeed.runtime import compiler

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer
from tests.e2e.launching import free_port
from tests.trainer.test_lora_sft_trainer import RECORDS


def library_attributes() -> dict[str, Any]:
    """Every attribute of another library a run may replace, as it is now."""
    return {
        "deepspeed.runtime.compiler.compile": compiler.compile,
        "cpuinfo.get_cpu_info": cpuinfo.get_cpu_info,
        "AcceleratorState": dict(AcceleratorState._shared_state),
        "PartialState": dict(PartialState._shared_state),
    }


def test_after_each_of_two_deepspeed_runs_the_libraries_are_their_own(tiny_model_dir, tmp_path, no_launcher):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        no_launcher.setenv(name, value)  # one process, launched: what torchrun (or run_sft alone) gives DeepSpeed
    no_launcher.setenv("MASTER_PORT", str(free_port()))
    own = {"deepspeed.runtime.compiler.compile": compiler.compile, "cpuinfo.get_cpu_info": cpuinfo.get_cpu_info}
    for run in ("first", "second"):
        args = SFTTrainingArguments(
            output_dir=str(tmp_path / run),
            deepspeed="stage0",  # DeepSpeed's start is trimmed for the run (hf_lora_ds._compat)
            use_cpu=True,
            max_steps=2,
            per_device_train_batch_size=4,
            learning_rate=1e-2,
            lora_dropout=0.0,
            report_to="none",
            save_strategy="no",
        )
        trainer = LoraSFTTrainer(str(tiny_model_dir), args, train_dataset=RECORDS)
        assert trainer.is_deepspeed_enabled
        before = library_attributes()  # accelerate's state as the trainer's Accelerator made it
        trainer.train()
        assert library_attributes() == before, run
        assert {name: before[name] for name in own} == own, run
