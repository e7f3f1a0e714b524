"""Generation-based answer accuracy: tasks that score completions, batched and distributed generation, reports.

    from hf_lora_ds.eval import evaluate, print_comparison
    before = evaluate(model, tokenizer, "data/sum_to_x/eval.json", "sum_to_x")
    print_comparison({"base": before})

``python -m hf_lora_ds.eval --help`` runs the same from the command line, and scores predictions made elsewhere.
"""

from hf_lora_ds.eval.comparison import (
    evaluate_phase,
    format_comparison,
    print_comparison,
    run_eval_options,
    write_eval_report,
    write_predictions,
)
from hf_lora_ds.eval.evaluator import EvalResult, Prediction, evaluate, load_samples, score_predictions
from hf_lora_ds.eval.generate import Generation, generate, stop_token_ids
from hf_lora_ds.eval.sum_to_x import DEFAULT_PREFIX, SumToXTask
from hf_lora_ds.eval.tasks import (
    ExactMatchTask,
    NumericTask,
    RegexTask,
    Sample,
    Task,
    Verdict,
    available_tasks,
    get_task,
    register_task,
)

__all__ = [
    "evaluate",
    "evaluate_phase",
    "run_eval_options",
    "score_predictions",
    "load_samples",
    "EvalResult",
    "Prediction",
    "generate",
    "Generation",
    "stop_token_ids",
    "format_comparison",
    "print_comparison",
    "write_predictions",
    "write_eval_report",
    "Task",
    "Sample",
    "Verdict",
    "register_task",
    "get_task",
    "available_tasks",
    "SumToXTask",
    "DEFAULT_PREFIX",
    "ExactMatchTask",
    "RegexTask",
    "NumericTask",
]
