"""docs/memory.md's planner table: what ``python -m hf_lora_ds.plan`` recommends for the Qwen2.5 Instruct shapes in
examples/model_configs on common GPUs, and the 14B on 2 x 32 GB under each configuration. Planning only (config.json
files, meta device): runs anywhere in a few minutes.

    python bench/plan_table.py [--max_length 2048] [--batch_size 4] [--lora_rank 16]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from hf_lora_ds.cli.plan import parse
from hf_lora_ds.plan.planner import SequenceProfile, recommend
from hf_lora_ds.plan.run_plan import plan_run

MODELS = ("qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-7b-instruct", "qwen2.5-14b-instruct")
GPUS = ("24GB", "32GB", "80GB")
DEVICES = (1, 2, 8)


def rows_for(model: str, memory: str, devices: int, options: argparse.Namespace):
    args, plan_args = parse(
        [
            "--model_name_or_path",
            f"examples/model_configs/{model}",
            "--device",
            "gpu",
            "--device_memory",
            memory,
            "--world_size",
            str(devices),
            "--max_length",
            str(options.max_length),
            "--per_device_train_batch_size",
            str(options.batch_size),
            "--lora_rank",
            str(options.lora_rank),
            "--dtype",
            "bfloat16",
        ]
    )
    with contextlib.redirect_stdout(sys.stderr):
        return plan_run(args, plan_args, SequenceProfile.unknown(options.max_length))


def cell(rows) -> str:
    chosen = recommend(rows)
    if chosen is None:
        return "does not fit"
    name = "DDP" if chosen.config == "none" else chosen.config.removesuffix(".json")
    return f"{name}{' + GC' if chosen.gradient_checkpointing else ''}, batch ≤ {chosen.max_batch_size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max_length", type=int, default=2048)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--lora_rank", type=int, default=16)
    options = parser.parse_args()
    header = [f"{memory} x {devices}" for memory in GPUS for devices in DEVICES]
    print("| model | " + " | ".join(header) + " |")
    print("|---" * (len(header) + 1) + "|")
    for model in MODELS:
        cells = [cell(rows_for(model, memory, devices, options)) for memory in GPUS for devices in DEVICES]
        print(f"| {model} | " + " | ".join(cells) + " |", flush=True)
    print("\n14B on 2 x 32 GB, per configuration (per-GPU peak, fits, largest batch):\n")
    print("| configuration | no GC | with GC |\n|---|---|---|")
    rows = rows_for("qwen2.5-14b-instruct", "32GB", 2, options)
    for config in dict.fromkeys(row.config for row in rows):
        found = {row.gradient_checkpointing: row for row in rows if row.config == config}
        cells = [
            f"{found[gc].estimate.device_bytes / 2**30:.1f} GiB, {'fits' if found[gc].fits else 'no'}, "
            f"{found[gc].max_batch_size}"
            for gc in (False, True)
        ]
        print(f"| {'DDP / none' if config == 'none' else config} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
