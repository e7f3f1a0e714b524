"""Generate the bundled sum-to-x SFT data: prompt ``{x}=``, answer ``王大丫丫的回答是--->{a} + {b}`` with a + b = x.

The answer format is new to the bundled base model (pre-trained on plain ``{a} + {b}``), so accuracy before LoRA is
~0 and after is high: a demo where the effect of fine-tuning is visible in minutes on a CPU. ``a`` is kept small
(1..9) so the arithmetic is a one-digit subtraction a ~1M-parameter model can learn. Eval x values never appear in
train, so eval accuracy measures generalisation, not recall.

    python scripts/make_sum_to_x.py            # writes data/sum_to_x/{train,eval}.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

__all__ = ["ANSWER_PREFIX", "make_record", "split_x_values", "make_splits", "main"]

ANSWER_PREFIX = "王大丫丫的回答是--->"
A_VALUES = range(1, 10)


def make_record(x: int, a: int) -> dict[str, str]:
    """One alpaca record; the input field is empty because the prompt is the whole instruction."""
    return {"instruction": f"{x}=", "input": "", "output": f"{ANSWER_PREFIX}{a} + {x - a}"}


def split_x_values(rng: random.Random, x_min: int, x_max: int, num_eval: int) -> tuple[list[int], list[int]]:
    """Hold out ``num_eval`` x values at random across the whole range, so eval covers every digit length."""
    xs = list(range(x_min, x_max + 1))
    eval_xs = set(rng.sample(xs, num_eval))
    return [x for x in xs if x not in eval_xs], sorted(eval_xs)


def make_splits(
    seed: int = 0, x_min: int = 10, x_max: int = 999, num_eval: int = 150, per_x: int = 3
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Train: ``per_x`` records with distinct a for each train x, shuffled. Eval: one record per held-out x."""
    if x_min <= max(A_VALUES):
        raise ValueError(f"x_min must exceed {max(A_VALUES)} so that b = x - a stays positive; got {x_min}")
    rng = random.Random(seed)
    train_xs, eval_xs = split_x_values(rng, x_min, x_max, num_eval)
    train = [make_record(x, a) for x in train_xs for a in rng.sample(A_VALUES, per_x)]
    rng.shuffle(train)
    evaluation = [make_record(x, rng.choice(A_VALUES)) for x in eval_xs]
    return train, evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--x_min", type=int, default=10)
    parser.add_argument("--x_max", type=int, default=999)
    parser.add_argument("--num_eval", type=int, default=150, help="held-out x values, one eval record each")
    parser.add_argument("--per_x", type=int, default=3, help="train records (distinct a) per train x value")
    parser.add_argument("--out_dir", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "sum_to_x")
    args = parser.parse_args()

    train, evaluation = make_splits(args.seed, args.x_min, args.x_max, args.num_eval, args.per_x)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, records in (("train", train), ("eval", evaluation)):
        path = args.out_dir / f"{name}.json"
        path.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {len(records)} records to {path}")


if __name__ == "__main__":
    main()
