"""The before/after comparison: a table like the one people publish for this task, and the files behind it.

The table puts each eval in a column (base, base + adapter) and each measure in a row: accuracy, samples, total
time, generated tokens/s, peak accelerator memory, peak host RSS, then how many completions failed for each reason,
because "0.0 before" means little until it says "150 × no prefix". Writers only write on rank 0, where every rank
holds the same result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformers.utils import logging

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.data.run_data import image_bounds
from hf_lora_ds.distributed import rank_and_world
from hf_lora_ds.eval.evaluator import EvalResult, evaluate
from hf_lora_ds.sizes import format_bytes

__all__ = [
    "evaluate_phase",
    "run_eval_options",
    "format_comparison",
    "print_comparison",
    "write_predictions",
    "write_eval_report",
]

logger = logging.get_logger(__name__)

_ROWS: list[tuple[str, Callable[[EvalResult], Any]]] = [
    ("accuracy", lambda r: f"{r.accuracy:.3f}"),
    ("correct / samples", lambda r: f"{r.num_correct} / {r.num_samples}"),
    ("total time (s)", lambda r: f"{r.total_time_s:.2f}"),
    ("generated tokens", lambda r: r.generated_tokens),
    ("generated tokens/s", lambda r: None if r.generated_tokens_per_s is None else f"{r.generated_tokens_per_s:.1f}"),
    ("peak accelerator memory", lambda r: _bytes(r.peak_accelerator_bytes)),
    ("peak host RSS", lambda r: _bytes(r.peak_host_rss_bytes)),
    ("ranks", lambda r: r.world_size),
    ("weights in generation", lambda r: r.generation_weights),
]


def format_comparison(results: Mapping[str, EvalResult]) -> str:
    """A plain-text table with one column per labelled result (e.g. ``{"base": r0, "base + adapter": r1}``)."""
    if not results:
        raise ValueError("format_comparison needs at least one result")
    reasons = list(dict.fromkeys(reason for r in results.values() for reason in r.reasons))
    rows = [["", *results]]
    for name, get in _ROWS:
        values = [get(r) for r in results.values()]
        if any(value is not None for value in values):  # scoring alone has no generation or memory numbers
            rows.append([name, *(_cell(value) for value in values)])
    rows += [[f"wrong: {reason}", *(str(r.reasons.get(reason, 0)) for r in results.values())] for reason in reasons]
    task = ", ".join(dict.fromkeys(r.task for r in results.values()))
    return "\n".join([f"eval task: {task}", *_align(rows)])


def _align(rows: list[list[str]]) -> list[str]:
    """Names left-aligned, numbers right-aligned, two spaces between columns."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    return ["  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]) for row in rows]


def print_comparison(results: Mapping[str, EvalResult]) -> None:
    """Log :func:`format_comparison` (a command shows it on rank 0: hf_lora_ds.cli.log)."""
    logger.info(format_comparison(results))


def run_eval_options(args: SFTTrainingArguments) -> dict[str, Any]:
    """How a run's evals generate, as ``evaluate``'s (and ``AnswerAccuracyCallback``'s) keywords: the eval batch
    size, the system prompt, whether ZeRO-3's weights are gathered, and the pixels an image keeps (as in
    training)."""
    return {
        "batch_size": args.per_device_eval_batch_size,
        "system_prompt": args.system_prompt,
        "gather_zero3_weights": args.eval_gather_zero3_weights,
        "image_bounds": image_bounds(args),
    }


def evaluate_phase(model, tokenizer, records: list, task, args: SFTTrainingArguments, phase: str) -> EvalResult:
    """One labelled eval of a run (``before``/``after``) at its eval batch size and system prompt, its predictions
    written to ``<output_dir>/predictions_<phase>.jsonl``."""
    result = evaluate(model, tokenizer, records, task, **run_eval_options(args))
    write_predictions(result, Path(args.output_dir, f"predictions_{phase}.jsonl"))
    return result


def write_predictions(result: EvalResult, path: str | Path) -> Path:
    """One JSON line per record: prompt, reference, output, parsed answer, correct, reason, tokens, stopped."""
    path = Path(path)
    if _is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for prediction in result.predictions:
                f.write(json.dumps(asdict(prediction), ensure_ascii=False) + "\n")
    return path


def write_eval_report(results: Mapping[str, EvalResult], path: str | Path) -> Path:
    """``{label: summary}`` as JSON, e.g. ``{"before": {"accuracy": ...}, "after": {...}}`` for eval_report.json."""
    path = Path(path)
    if _is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
        summaries = {label: result.summary() for label, result in results.items()}
        path.write_text(json.dumps(summaries, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def _is_main() -> bool:
    return rank_and_world()[0] == 0


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _bytes(value: int | None) -> str | None:
    return None if value is None else format_bytes(value)
