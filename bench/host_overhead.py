"""Host time per training step: this package against TRL's SFTTrainer on a model so small that its arithmetic is
negligible, so a step's wall time is what the host does around it (Python, callbacks, collation, op dispatch).

On a GPU that host time is what a launch-bound step waits on (bench/gpu/README.md: the first H200 run's 0.5B steps
took 0.3-0.4 s for 20-30 ms of arithmetic). The runs and their phase breakdown are bench/gpu/speed.py's and
step_timing.py's (the same trainers, flags and timer; perf_counter on the CPU), one thread, the trainers alternated
for ``--rounds`` rounds in one process; each round's ratio is hf_lora_ds's step time over TRL's.

    python bench/host_overhead.py [--rounds 2] [--timed 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))  # the speed stage's runs and timer
from qwen_shape import write_chats  # noqa: E402
from speed import SpeedShape, _import_as_a_command, _Run, run_hf_lora_ds, run_trl  # noqa: E402
from step_timing import Windows  # noqa: E402

from hf_lora_ds._testing.tiny_models import build_tiny_qwen2, train_chat_tokenizer  # noqa: E402

TRAINERS = {
    "hf_lora_ds": lambda shape, work, run, windows: run_hf_lora_ds(shape, work, run, windows),
    "trl_default": lambda shape, work, run, windows: run_trl(shape, work, run, windows, fastest=False),
    "trl_fastest": lambda shape, work, run, windows: run_trl(shape, work, run, windows, fastest=True),
}
SHAPE = SpeedShape("host", "tiny", "chats.jsonl", 16, 256, packed=False)  # 16 short chats a step, padded


def build(work: Path, steps: int) -> None:
    """A 2-layer Qwen2 of hidden size 16 with a 320-token vocabulary, and short one-turn chats."""
    chats = write_chats(work / SHAPE.chats, SHAPE.batch * steps, longest_answer=20)
    corpus = [line for line in chats.read_text(encoding="utf-8").splitlines()]
    tokenizer = train_chat_tokenizer(corpus, vocab_size=320)
    model = build_tiny_qwen2(tokenizer, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    model.save_pretrained(work / SHAPE.model)
    tokenizer.save_pretrained(work / SHAPE.model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timed", type=int, default=40, help="timed steps a run, after 5 warm-up steps")
    options = parser.parse_args()
    torch.set_num_threads(1)
    windows = Windows(warmup=5, timed=options.timed, profiled=1)
    _import_as_a_command()
    steps: dict[str, list[float]] = {name: [] for name in TRAINERS}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        build(work, windows.total)
        for round_index in range(options.rounds):
            for name, runner in TRAINERS.items():
                figures = runner(SHAPE, work, _Run(work, f"{name}-{round_index}", windows, on_cpu=True), windows)
                steps[name].append(figures["step_ms"])
                phases = ", ".join(f"{phase} {ms:.1f}" for phase, ms in figures["breakdown_ms"].items())
                print(f"round {round_index} {name}: {figures['step_ms']:.1f} ms a step ({phases})", flush=True)
    print("\n| trainer | host ms a step (median of rounds) | hf_lora_ds / it |\n| --- | --- | --- |")
    ours = statistics.median(steps["hf_lora_ds"])
    for name, values in steps.items():
        print(f"| {name} | {statistics.median(values):.1f} | {ours / statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
