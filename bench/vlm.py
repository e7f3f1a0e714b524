"""Vision-language throughput: this package against TRL's ``SFTTrainer`` on the same tiny VLM and images, same run.

Both train LoRA (r=8) on the language model's linear layers only, the tower and projector frozen, on the same
synthetic image records ("which colour is the square?", 1-2 images of varying sizes, a few text-only ones), fp32,
padded batches, one epoch. TRL gets its records as prompt-completion with ``completion_only_loss`` (its VLM collator
has no assistant-only loss for messages, trl#3751), so both train the same answer tokens. Each variant runs in its
own process: printed are supervised tokens per second of wall and of CPU time, peak RSS, the tower's parameters that
got a gradient (a frozen tower must cost no backward: 0 in both), and the ratio of this package to TRL.

    python bench/vlm.py [--family qwen2_5_vl] [--samples 96] [--batch_size 8] [--variants trl,hf_lora_ds]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's hf_lora_ds, also when not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/throughput.py's run settings

from throughput import common_args as text_common_args  # noqa: E402

from hf_lora_ds import IGNORE_INDEX, LoraSFTTrainer, SFTTrainingArguments  # noqa: E402
from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm  # noqa: E402
from hf_lora_ds.vision.modules import PROJECTOR, TOWER, vision_parts  # noqa: E402

VARIANTS = ("trl", "hf_lora_ds")
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220)}
LM_LINEAR = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def make_records(n: int, seed: int, image_dir: Path) -> list[dict]:
    """Prompt-completion records: a square of one colour on 1-2 images of 48-96 pixels a side; every 8th text-only."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        colour = rng.choice(list(COLOURS))
        images = []
        for j in range(0 if i % 8 == 7 else rng.choice((1, 2))):
            width, height = rng.randint(48, 96), rng.randint(48, 96)
            image = Image.new("RGB", (width, height), (255, 255, 255))
            ImageDraw.Draw(image).rectangle((8, 8, width // 2, height // 2), fill=COLOURS[colour])
            path = image_dir / f"{i}_{j}.png"
            image.save(path)
            images.append(str(path))
        parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": "Which colour is the square?"}]
        answer = f"The square is {colour}." if images else "There is no picture."
        records.append(
            {
                "prompt": [{"role": "user", "content": parts}],
                "completion": [{"role": "assistant", "content": [{"type": "text", "text": answer}]}],
                "images": images,
            }
        )
    return records


def common_args(output_dir: str, batch_size: int) -> dict:
    """bench/throughput.py's settings, with the images column kept for the collator."""
    return {**text_common_args(output_dir, batch_size), "remove_unused_columns": False}


def make_trainer(variant: str, model, processor, records: list[dict], workdir: str, batch_size: int):
    if variant == "trl":
        import datasets
        from peft import LoraConfig
        from trl import SFTConfig, SFTTrainer

        rows = [{**record, "images": [Image.open(path) for path in record["images"]]} for record in records]
        config = SFTConfig(**common_args(workdir, batch_size), max_length=None, completion_only_loss=True)
        return SFTTrainer(
            model,
            args=config,
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=processor,
            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=LM_LINEAR, lora_dropout=0.0),
        )
    args = SFTTrainingArguments(
        **common_args(workdir, batch_size), lora_rank=8, lora_alpha=16, lora_dropout=0.0, eval_file="", train_file=""
    )
    return LoraSFTTrainer(model, args, train_dataset=records, processing_class=processor)


class TrainClock(TrainerCallback):
    """Wall and CPU time of the training steps after the first (start-up left out)."""

    def __init__(self):
        self.steps = 0
        self.wall = self.cpu = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
        if self.steps > 1:
            self.wall += time.perf_counter() - self._wall
            self.cpu += time.process_time() - self._cpu


def measure(variant: str, args: argparse.Namespace) -> dict:
    """One variant in this process: one epoch; supervised tokens counted from the batches its dataloader yields."""
    with tempfile.TemporaryDirectory() as workdir:
        image_dir = Path(workdir, "images")
        image_dir.mkdir()
        records = make_records(args.samples, args.seed, image_dir)
        model, processor = build_tiny_vlm(args.family)
        trainer = make_trainer(variant, model, processor, records, workdir, args.batch_size)
        batches = list(trainer.get_train_dataloader())
        supervised = [int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) for batch in batches]
        clock = TrainClock()
        trainer.add_callback(clock)
        trainer.train()
        parts = vision_parts(trainer.model)
        tower_grads = sum(
            param.grad is not None
            for name, param in trainer.model.named_parameters()
            if parts.part_of(name) in (TOWER, PROJECTOR)
        )
    timed = sum(supervised[1:])  # the first step's tokens are left out with its time
    return {
        "variant": variant,
        "supervised_tokens": sum(supervised),
        "tokens_per_s_wall": timed / clock.wall,
        "tokens_per_s_cpu": timed / clock.cpu,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "tower_params_with_grad": tower_grads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen2_5_vl")
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this variant here, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    results = {}
    for variant in args.variants.split(","):
        command = [sys.executable, __file__, "--one", variant, *sys.argv[1:]]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(output.strip().splitlines()[-1])
    for variant, result in results.items():
        print(
            f"{variant:>11}: {result['supervised_tokens']} supervised tokens, "
            f"{result['tokens_per_s_wall']:.1f}/s wall, {result['tokens_per_s_cpu']:.1f}/s CPU, "
            f"peak RSS {result['peak_rss_gib']:.2f} GiB, "
            f"tower parameters with a gradient: {result['tower_params_with_grad']}"
        )
    if {"trl", "hf_lora_ds"} <= results.keys():
        ratio = results["hf_lora_ds"]["tokens_per_s_cpu"] / results["trl"]["tokens_per_s_cpu"]
        print(f"hf_lora_ds / trl supervised tokens per CPU-second: {ratio:.2f}x")


if __name__ == "__main__":
    main()
