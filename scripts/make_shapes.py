"""Generate the bundled vision demo data: "Which colour is the square?" about a small PNG of one coloured square.

Each image is 64 x 64 pixels: a grey background with a little noise, and one square of a random size and place in
one of ``COLOURS``. The answer is the colour's name, which the bundled vision base (``scripts/build_tiny_vlm.py``)
has never been taught to say about an image, so accuracy before LoRA is ~0 and after it is high. Records are chat
messages with an image part whose path is relative to the data file, as users write them; the images sit in
``images/`` beside ``train.jsonl`` and ``eval.jsonl``. Eval images are drawn from the same rule with other seeds, so
eval accuracy measures reading new images, not recall.

    python scripts/make_shapes.py            # writes data/shapes/{train,eval}.jsonl and data/shapes/images/
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from PIL import Image, ImageDraw

__all__ = ["COLOURS", "QUESTION", "draw_square", "make_record", "make_split", "main"]

DATA_DIR = Path(__file__).resolve().parents[1] / "hf_lora_ds" / "resources" / "demo" / "shapes"
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (230, 210, 40)}
QUESTION = "Which colour is the square? Answer 1 for red, 2 for green, 3 for blue, 4 for yellow."
SIZE = 64


def draw_square(rng: random.Random, colour: str) -> Image.Image:
    """A ``SIZE`` x ``SIZE`` grey image with sparse noise and one ``colour`` square, 36 to 56 pixels a side
    (the random frozen tower of the bundled base passes a smaller square's colour on too faintly to learn in a demo)."""
    image = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
    draw = ImageDraw.Draw(image)
    for _ in range(40):  # specks, so no two backgrounds are alike
        x, y, shade = rng.randrange(SIZE), rng.randrange(SIZE), rng.randrange(96, 161)
        draw.point((x, y), fill=(shade, shade, shade))
    side = rng.randint(36, 56)
    left, top = rng.randint(0, SIZE - side), rng.randint(0, SIZE - side)
    draw.rectangle((left, top, left + side - 1, top + side - 1), fill=COLOURS[colour])
    return image


def make_record(image_path: str, colour: str) -> dict:
    """One chat record: the image and the question in the user turn, the colour's name as the answer."""
    user = [{"type": "image", "image": image_path}, {"type": "text", "text": QUESTION}]
    answer = str(list(COLOURS).index(colour) + 1)
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def make_split(out_dir: Path, name: str, count: int, seed: int) -> list[dict]:
    """``count`` records with their PNGs written to ``out_dir/images/<name>_NNNN.png``; colours evenly spread."""
    rng = random.Random(seed)
    names = list(COLOURS)
    records = []
    for i in range(count):
        colour = names[i % len(names)]
        path = f"images/{name}_{i:04d}.png"
        draw_square(rng, colour).save(out_dir / path, optimize=True)
        records.append(make_record(path, colour))
    rng.shuffle(records)
    return records


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", type=Path, default=DATA_DIR)
    parser.add_argument("--num_train", type=int, default=320)
    parser.add_argument("--num_eval", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shutil.rmtree(args.out_dir / "images", ignore_errors=True)
    (args.out_dir / "images").mkdir(parents=True)
    _write_jsonl(args.out_dir / "train.jsonl", make_split(args.out_dir, "train", args.num_train, args.seed))
    _write_jsonl(args.out_dir / "eval.jsonl", make_split(args.out_dir, "eval", args.num_eval, args.seed + 1))
    print(f"wrote {args.num_train} train and {args.num_eval} eval records to {args.out_dir}")
    return args.out_dir


if __name__ == "__main__":
    main()
