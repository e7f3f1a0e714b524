"""The eval that says whether the model learned the task: answer accuracy on the eval records before training (the
base the run started from) and after, through the live engine (under ZeRO-3 it gathers the weights for generation),
written to ``eval_report.json`` and the run report, logged as the accuracy's end points and printed side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hf_lora_ds.callbacks import log_accuracy_end_points, write_run_report
from hf_lora_ds.eval import evaluate_phase, print_comparison, write_eval_report
from hf_lora_ds.eval.evaluator import EvalResult

if TYPE_CHECKING:
    from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer

__all__ = ["before_and_after"]


def before_and_after(trainer: LoraSFTTrainer) -> dict[str, EvalResult]:
    """``{"before": ..., "after": ...}`` on the trainer's eval records, reported; ``{}`` without eval records. Every
    rank must call it. "before" is the base the run started from (the adapter off, or back at its start where
    PiSSA-like inits rewrote the base): the base, even for a resumed run."""
    if not trainer.eval_records:
        return {}
    model, tokenizer, records, task, args = (
        trainer.model_wrapped,
        trainer.processing_class,
        trainer.eval_records,
        trainer.task,
        trainer.args,
    )
    results = {}
    with trainer.base_model_view():
        results["before"] = evaluate_phase(model, tokenizer, records, task, args, "before")
    results["after"] = evaluate_phase(model, tokenizer, records, task, args, "after")
    report_path = write_eval_report(results, Path(args.output_dir, "eval_report.json"))
    log_accuracy_end_points(trainer, results["before"].accuracy, results["after"].accuracy)
    write_run_report(trainer, report_path)
    print_comparison(results)
    return results
