"""LoRA variants benchmark: which start and which optimizer reach the task fastest, on the bundled demo.

Each variant trains the demo (data/tiny-qwen2-sum on data/sum_to_x: run_sft.py's defaults) from the same seed, on the
same data, for the same step budget, one after another in this process, and is scored on the held-out set every
``--eval_every`` steps by the run's own answer-accuracy eval. Printed side by side, measured in this run: the first
evaluated step with accuracy >= ``--target``, the accuracy after the last step, and the CPU time per optimizer step
(training only, from the second step: evaluations are timed out), also as a ratio to default LoRA. The init's own
cost (an SVD of every adapted weight, a data pass) is in the setup time: from the call to the trainer built
(data read from the cache, model loaded, adapter started).

    python bench/lora_variants.py [--max_steps 150] [--eval_every 10] [--variants default,pissa,olora,eva,loraplus]
        [-- any run_sft.py flag, e.g. --learning_rate 1e-3]

The variants share every flag but their own, including ``--lora_dropout 0`` (PiSSA's and CorDA's adapter carries the
weights' principal part, which dropout on its input would drop too).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

from hf_lora_ds import run_sft

VARIANTS = {
    "default": [],
    "pissa": ["--lora_init", "pissa"],
    "pissa_niter_4": ["--lora_init", "pissa_niter_4"],
    "olora": ["--lora_init", "olora"],
    "eva": ["--lora_init", "eva"],
    "corda": ["--lora_init", "corda"],
    "loftq": ["--lora_init", "loftq", "--load_in_4bit"],
    "loraplus": ["--lora_optimizer", "loraplus"],
    "lorafa": ["--lora_optimizer", "lorafa"],
}


class StepTimer(TrainerCallback):
    """This process's CPU time inside optimizer steps only (the evaluations between them are not training), from
    the second step on (the first one warms up the allocator and the kernels). CPU time, not wall time: on a machine
    other jobs share, wall time per step measures their load as much as the variant (seen here: 0.49 to 1.59 s a
    step for the same computation)."""

    def __init__(self) -> None:
        self.seconds, self.steps, self._start = 0.0, 0, time.process_time()
        self.setup_seconds = 0.0

    def on_init_end(self, args, state, control, **kwargs):
        self.setup_seconds = time.process_time() - self._start  # data, model and the adapter's start

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step > 1:
            self.seconds += time.process_time() - self._start
            self.steps += 1


def run_variant(name: str, options: argparse.Namespace, extra: list[str], workdir: Path) -> dict:
    out = workdir / name
    timer = StepTimer()
    flags = [
        "--output_dir",
        str(out),
        "--max_steps",
        str(options.max_steps),
        "--eval_strategy",
        "steps",
        "--eval_steps",
        str(options.eval_every),
        "--lora_dropout",
        "0",
        "--seed",
        "0",
        "--disable_tqdm",
        "true",
        *extra,
        *VARIANTS[name],
    ]
    results = run_sft.main(flags, callbacks=[timer])
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    curve = [(entry["step"], entry["eval_accuracy"]) for entry in history if "eval_accuracy" in entry]
    reached = next((step for step, accuracy in curve if accuracy >= options.target), None)
    return {
        "variant": name,
        "steps_to_target": reached,
        "final_accuracy": results["after"]["accuracy"],
        "seconds_per_step": timer.seconds / max(timer.steps, 1),
        "setup_seconds": timer.setup_seconds,
        "curve": curve,
    }


def table(rows: list[dict], target: float) -> str:
    base = next((row["seconds_per_step"] for row in rows if row["variant"] == "default"), None)
    lines = [
        f"{'variant':<15}{f'steps to acc>={target:g}':>20}{'final acc':>11}{'CPU s/step':>12}{'x default':>11}"
        f"{'setup CPU s':>13}"
    ]
    for row in rows:
        reached = row["steps_to_target"] if row["steps_to_target"] is not None else "not reached"
        ratio = f"{row['seconds_per_step'] / base:.2f}" if base else "-"
        lines.append(
            f"{row['variant']:<15}{reached:>20}{row['final_accuracy']:>11.3f}{row['seconds_per_step']:>12.3f}"
            f"{ratio:>11}{row['setup_seconds']:>13.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_steps", type=int, default=150, help="the step budget of every variant (the demo's)")
    parser.add_argument("--eval_every", type=int, default=10, help="steps between accuracy evaluations")
    parser.add_argument("--target", type=float, default=0.9, help="the accuracy whose first step is reported")
    parser.add_argument(
        "--variants", default="default,pissa,olora,eva,loraplus", help=f"comma-separated, among {', '.join(VARIANTS)}"
    )
    parser.add_argument("--output", type=Path, default=None, help="also write the rows (with each curve) as JSON")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="train into DIR/<variant> and keep it (the adapters, to score with hf_lora_ds.eval)",
    )
    parser.add_argument(
        "--rows",
        type=Path,
        nargs="+",
        default=None,
        help="train nothing: print the table of rows that runs wrote with --output (variants trained "
        "as separate processes, one at a time or side by side)",
    )
    options, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    if options.rows:
        print(table([row for path in options.rows for row in json.loads(path.read_text())], options.target))
        return
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in options.variants.split(","):
            rows.append(run_variant(name, options, extra, options.keep or Path(workdir)))
            print(f"{name}: accuracy by step {rows[-1]['curve']}", flush=True)
    print(table(rows, options.target))
    if options.output:
        options.output.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
