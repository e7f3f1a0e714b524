"""The tensors alive at a training step's peak, grouped by the op that allocated them: what a memory plan misses.

Builds run_sft's trainer in this process from its flags (after ``--``), records every allocation of the chosen
training steps (forward and backward) with ``torch.profiler(profile_memory=True)`` and prints, per step, the peak
above the step's start and the tensors alive at that peak, grouped by the op that allocated each (the innermost op
and the one around it). With ``--deepspeed`` and no launcher, one rank is set up here. Made for the CPU; on CUDA the
same events come with the CUDA activity (untried).

    python bench/peak_tensors.py --steps 1 -- --model_name_or_path M --train_file chats.jsonl --eval_file "" \\
        --use_cpu true --max_steps 2 --save_strategy no --report_to none --deepspeed stage3

Run with and without ``--deepspeed stage3`` on a Qwen2.5-0.5B-wide model, it found the linear inputs ZeRO-3 keeps
(bench/gpu/README.md, "ZeRO-3's linear").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


def live_at_peak(trace: dict) -> tuple[int, Counter]:
    """The peak of allocated bytes over a profiler trace (above its start) and the bytes alive then, by
    ``"outer op > op"`` of the op that allocated them."""
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    total = peak = peak_index = 0
    for index, event in enumerate(memory):
        total += event["args"]["Bytes"]
        if total > peak:
            peak, peak_index = total, index
    alive: dict[int, dict] = {}
    for event in memory[: peak_index + 1]:
        if event["args"]["Bytes"] > 0:
            alive[event["args"]["Addr"]] = event
        else:
            alive.pop(event["args"]["Addr"], None)
    groups: Counter = Counter()
    for event in alive.values():
        groups[_allocated_by(ops, event)] += event["args"]["Bytes"]
    return peak, groups


def _allocated_by(ops: list[dict], event: dict) -> str:
    around = sorted(
        (op for op in ops if op["tid"] == event["tid"] and op["ts"] <= event["ts"] <= op["ts"] + op["dur"]),
        key=lambda op: op["dur"],
    )
    return " > ".join(op["name"] for op in reversed(around[:2])) or "(outside any op)"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[1], help="training steps to record (1 = first)")
    parser.add_argument("--top", type=int, default=15, help="groups printed per step")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("run_sft_flags", nargs=argparse.REMAINDER, help="run_sft's flags, after --")
    options = parser.parse_args(argv)
    flags = [flag for flag in options.run_sft_flags if flag != "--"]
    if "--deepspeed" in flags and "RANK" not in os.environ:  # one rank without a launcher
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29531"))
    sys.path.insert(0, str(REPO))
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hf_lora_ds import LoraSFTTrainer
    from hf_lora_ds.cli.run import parse_args

    args = parse_args(flags)
    trainer = LoraSFTTrainer(args.model_name_or_path, args)
    training_step, results, seen = trainer.training_step, {}, [0]

    def recorded_step(*step_args, **step_kwargs):
        seen[0] += 1
        if seen[0] not in options.steps:
            return training_step(*step_args, **step_kwargs)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities, profile_memory=True) as profiler:
            loss = training_step(*step_args, **step_kwargs)
        with tempfile.TemporaryDirectory() as folder:
            profiler.export_chrome_trace(f"{folder}/trace.json")
            peak, groups = live_at_peak(json.loads(Path(folder, "trace.json").read_text(encoding="utf-8")))
        results[seen[0]] = {"peak_mib": peak / MIB, "alive_mib": {name: b / MIB for name, b in groups.most_common()}}
        print(f"step {seen[0]}: peak {peak / MIB:.1f} MiB above the step's start; alive then, by the op that made it:")
        for name, size in groups.most_common(options.top):
            print(f"  {size / MIB:10.2f} MiB  {name}")
        return loss

    trainer.training_step = recorded_step
    trainer.train()
    if options.json:
        options.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
