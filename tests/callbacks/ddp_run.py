"""Two-rank CPU run for test_ddp.py: ``torchrun --nproc_per_node 2 ddp_run.py MODEL_DIR OUTPUT_DIR``.

Rank 1 holds an extra HOLD_MIB of host RAM from its first step on, so the min and max across ranks must differ.
The accelerator statistics come from a fake allocator that each rank drives with its own numbers (``device_mib``),
and throughput runs on a fake clock (1 s a training forward, 100 s an evaluation one) with a given peak, so the
gathered memory figures and the MFU have exact expected values. Rank 0 writes the log history to
OUTPUT_DIR/log_history.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

from hf_lora_ds.callbacks import MemoryTraceCallback, ThroughputCallback, throughput, use_swanlab
from hf_lora_ds.cli.log import configure_logging
from hf_lora_ds.distributed import release_process_group
from hf_lora_ds.training import memory_tracker

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: torchrun runs this file as a script
from tests.callbacks.callback_helpers import (  # noqa: E402
    LENGTHS,
    FakeAllocator,
    FakeClock,
    TokenDataset,
    add_lora,
    pad_collate,
)

HOLD_MIB = 64
PEAK_FLOPS = 1e9


def device_mib(rank: int) -> dict[str, int]:
    """Rank r's fake accelerator: ``base`` MiB allocated throughout, a ``spike`` just before its first step. Rank 1
    has the larger base, rank 0 the larger spike, so neither rank holds every minimum (or every maximum)."""
    return {"base": 100 * (rank + 1), "spike": 2000 - 1000 * rank}


class HoldOnRankOne(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if args.process_index == 1 and not hasattr(self, "held"):
            self.held = b"x" * (HOLD_MIB << 20)


class SpikeBeforeFirstStep(TrainerCallback):
    def __init__(self, allocator: FakeAllocator, rank: int) -> None:
        self.allocator, self.mib = allocator, device_mib(rank)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.allocator.set(self.mib["spike"])
            self.allocator.set(self.mib["base"])


def main(model_dir: str, output_dir: str) -> None:
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=2,
        num_train_epochs=1,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="no",
        use_cpu=True,
        report_to="swanlab",
        disable_tqdm=True,
    )
    configure_logging(args)  # the package's lines as the commands show them: rank 0's, on stdout
    rank = int(os.environ["RANK"])
    allocator, clock = FakeAllocator(), FakeClock(train_s=1.0, eval_s=100.0)
    allocator.set(device_mib(rank)["base"])
    memory_tracker.device_memory_api = lambda: allocator
    throughput.time = SimpleNamespace(perf_counter=clock)
    memory_trace = MemoryTraceCallback()
    with memory_trace.phase("load"):
        model = add_lora(AutoModelForCausalLM.from_pretrained(model_dir))
    clock.attach(model)
    vocab = model.config.vocab_size
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenDataset(LENGTHS, vocab),
        eval_dataset=TokenDataset(LENGTHS[:4], vocab, seed=1),
        data_collator=pad_collate,
    )
    memory_trace.attach(trainer)
    ThroughputCallback(peak_flops=PEAK_FLOPS).attach(trainer)
    use_swanlab(trainer, project="hf-lora-ds-test", log_dir=str(Path(output_dir) / "swanlog"))
    trainer.add_callback(HoldOnRankOne())
    trainer.add_callback(SpikeBeforeFirstStep(allocator, rank))
    trainer.train()
    if trainer.is_world_process_zero():
        (Path(output_dir) / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    release_process_group()  # as run_sft does: a gloo group alive at exit can abort a finished rank


if __name__ == "__main__":
    main(*sys.argv[1:3])
