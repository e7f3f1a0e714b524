"""Generation-based answer accuracy: tasks that score completions, batched and distributed generation, reports.

    from hf_lora_ds.eval import evaluate, print_comparison
    before = evaluate(model, tokenizer, "data/sum_to_x/eval.json", "sum_to_x")
    print_comparison({"base": before})

``python -m hf_lora_ds.eval --help`` runs the same from the command line, and scores predictions made elsewhere.
"""

from hf_lora_ds._lazy import lazy_names

_EXPORTS = {
    "evaluate": "hf_lora_ds.eval.evaluator",
    "evaluate_phase": "hf_lora_ds.eval.comparison",
    "run_eval_options": "hf_lora_ds.eval.comparison",
    "score_predictions": "hf_lora_ds.eval.evaluator",
    "load_samples": "hf_lora_ds.eval.evaluator",
    "EvalResult": "hf_lora_ds.eval.evaluator",
    "Prediction": "hf_lora_ds.eval.evaluator",
    "generate": "hf_lora_ds.eval.generation",
    "Generation": "hf_lora_ds.eval.generation",
    "stop_token_ids": "hf_lora_ds.eval.generation",
    "format_comparison": "hf_lora_ds.eval.comparison",
    "print_comparison": "hf_lora_ds.eval.comparison",
    "write_predictions": "hf_lora_ds.eval.comparison",
    "write_eval_report": "hf_lora_ds.eval.comparison",
    "Task": "hf_lora_ds.eval.tasks",
    "Sample": "hf_lora_ds.eval.tasks",
    "Verdict": "hf_lora_ds.eval.tasks",
    "register_task": "hf_lora_ds.eval.task_registry",
    "get_task": "hf_lora_ds.eval.task_registry",
    "available_tasks": "hf_lora_ds.eval.task_registry",
    "SumToXTask": "hf_lora_ds.eval.sum_to_x",
    "DEFAULT_PREFIX": "hf_lora_ds.eval.sum_to_x",
    "ExactMatchTask": "hf_lora_ds.eval.tasks",
    "RegexTask": "hf_lora_ds.eval.tasks",
    "NumericTask": "hf_lora_ds.eval.tasks",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
