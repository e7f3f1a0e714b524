"""Minimal plain-Trainer + PEFT LoRA run that records what each rank saw, for the launch tests.

Launched by tests (and by hand) under ``deepspeed``, ``torchrun`` or plain ``python``. It uses only stock
``Trainer``, so a failure here is a distributed-setup problem, not one of our trainer subclass. Each rank writes
``probe_rank{N}.json`` into ``--output_dir`` with the world sizes seen by Trainer, torch.distributed and DeepSpeed,
the sample ids it was given, and the logged losses; rank 0 then runs ``verify_adapter`` on the final adapter and on
every ``checkpoint-*``. ``PROBE_NO_FIX=1`` skips hf_lora_ds.distributed, to reproduce the upstream failures.

    deepspeed --num_gpus 2 tests/scripts/lora_probe.py --model_dir M --deepspeed ds_configs/stage3.json \
        --output_dir OUT --max_steps 4
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments, set_seed

from hf_lora_ds.adapter import verify_adapter
from hf_lora_ds.distributed import describe_world, effective_global_batch, ensure_world_agreement, prepare_distributed


@dataclass
class ProbeArguments:
    model_dir: str = field(metadata={"help": "Saved tiny causal LM (e.g. from hf_lora_ds.tiny)."})
    num_samples: int = field(default=64, metadata={"help": "Synthetic training samples, each tagged with its id."})
    seq_len: int = field(default=16, metadata={"help": "Tokens per sample."})


# PROBE_NO_FIX=1 skips hf_lora_ds.distributed, to reproduce the upstream world-size bugs.
APPLY_FIX = os.environ.get("PROBE_NO_FIX", "0") != "1"


@dataclass
class ProbeTrainingArguments(TrainingArguments):
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep sample_id for the collator."})

    def __post_init__(self):
        if APPLY_FIX:
            prepare_distributed(self)
        super().__post_init__()
        if APPLY_FIX:
            ensure_world_agreement(self)


class TaggedDataset(torch.utils.data.Dataset):
    """Every sample is the same short repeating token cycle, so the loss falls within a few steps on any launch;
    ``sample_id`` lets each rank log which samples it was given."""

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int):
        cycle = torch.randint(3, vocab_size, (4,), generator=torch.Generator().manual_seed(1234))
        self.input_ids = cycle.repeat((seq_len + 3) // 4)[:seq_len]
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.input_ids, "sample_id": index}


class RecordingCollator:
    def __init__(self):
        self.seen: list[int] = []

    def __call__(self, features: list[dict]) -> dict:
        self.seen.extend(int(f["sample_id"]) for f in features)
        input_ids = torch.stack([f["input_ids"] for f in features])
        return {"input_ids": input_ids, "labels": input_ids.clone()}


def _deepspeed_world_size(trainer: Trainer) -> int | None:
    engine = trainer.model_wrapped
    return getattr(engine, "world_size", None) if trainer.is_deepspeed_enabled else None


def main() -> None:
    probe_args, args = HfArgumentParser((ProbeArguments, ProbeTrainingArguments)).parse_args_into_dataclasses()
    # Load after TrainingArguments: under ZeRO-3 its HfDeepSpeedConfig makes from_pretrained partition at load.
    model = AutoModelForCausalLM.from_pretrained(probe_args.model_dir, dtype=torch.float32)
    from peft import LoraConfig, get_peft_model

    set_seed(args.seed)  # Trainer seeds only in __init__, after the LoRA weights below were drawn
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    dataset = TaggedDataset(probe_args.num_samples, probe_args.seq_len, model.config.vocab_size)
    collator = RecordingCollator()
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    if args.process_index == 0:
        print(f"[probe] {describe_world(args)}", flush=True)
    trainer.train()
    trainer.save_model(args.output_dir)
    record = {
        "rank": args.process_index,
        "trainer_world_size": args.world_size,
        "dist_world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "deepspeed_world_size": _deepspeed_world_size(trainer),
        "env_world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "global_batch": effective_global_batch(args),
        "device": str(args.device),
        "wrapper": type(trainer.model_wrapped).__name__,
        "activation_checkpointing": bool(getattr(trainer.model, "is_activation_checkpointing", False)),
        "seen": collator.seen,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "global_step": trainer.state.global_step,
    }
    Path(args.output_dir, f"probe_rank{args.process_index}.json").write_text(json.dumps(record))
    trainer.accelerator.wait_for_everyone()
    if args.process_index == 0:
        for adapter_dir in [args.output_dir, *sorted(Path(args.output_dir).glob("checkpoint-*"))]:
            verify_adapter(adapter_dir, base_model=probe_args.model_dir)
            print(f"[probe] adapter verified: {adapter_dir}", flush=True)


if __name__ == "__main__":
    main()
