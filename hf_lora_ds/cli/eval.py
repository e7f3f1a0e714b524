"""Command line: evaluate a model (and compare it with its adapter), or score predictions made elsewhere.

    python -m hf_lora_ds.eval --model_name_or_path DIR [--adapter DIR] --task sum_to_x --data FILE
        [--compare] [--output_dir DIR]
    python -m hf_lora_ds.eval score --task sum_to_x --data FILE [--output FILE]

Under ``torchrun --nproc_per_node N`` the records are split across the N processes (each holds the whole model);
the result, printed by rank 0, is the same as one process's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from transformers.utils import logging

from hf_lora_ds.cli.flags import BASE_MODEL_SPELLINGS, respell
from hf_lora_ds.cli.log import configure_logging
from hf_lora_ds.data.records import load_records
from hf_lora_ds.distributed import release_process_group
from hf_lora_ds.errors import run_cli
from hf_lora_ds.eval.comparison import format_comparison, print_comparison, write_eval_report, write_predictions
from hf_lora_ds.eval.evaluator import EvalResult, evaluate, load_samples, score_predictions
from hf_lora_ds.eval.task_registry import available_tasks, get_task
from hf_lora_ds.eval.tasks import Task
from hf_lora_ds.launch.checks import check_output_path
from hf_lora_ds.model.adapter_check import check_adapter_directory
from hf_lora_ds.model.gguf_import import model_source, plain_model
from hf_lora_ds.model.source import check_model_source, hub_load_errors

__all__ = ["main", "build_parser", "build_score_parser"]

logger = logging.get_logger(__name__)


def _add_task_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task", default="sum_to_x", help=f"eval task by name (default: %(default)s); built in: {available_tasks()}"
    )
    parser.add_argument(
        "--task_kwargs",
        type=json.loads,
        default={},
        help='JSON options for the task, e.g. \'{"pattern": "answer: (\\\\d+)"}\' for --task regex',
    )
    parser.add_argument(
        "--data", required=True, type=Path, help="records as .json, .jsonl or .parquet, alpaca or messages format"
    )
    parser.add_argument(
        "--system_prompt", default=None, help="system turn for records that have none (default: the template's own)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hf_lora_ds.eval",
        description="Generate an answer for every record and report answer accuracy, time, tokens/s and memory.",
        epilog="Scoring only: python -m hf_lora_ds.eval score --help",
    )
    parser.add_argument(
        "--model_name_or_path", required=True, help="base model directory (or hub id already in the local cache)"
    )
    parser.add_argument(
        "--gguf_file",
        default=None,
        help="the model is this GGUF file inside --model_name_or_path DIR "
        "(or pass the .gguf path as --model_name_or_path)",
    )
    parser.add_argument("--adapter", default=None, help="LoRA adapter directory to load on top of --model_name_or_path")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model_name_or_path)")
    _add_task_arguments(parser)
    parser.add_argument(
        "--compare", action="store_true", help="evaluate the base model and base + adapter; print both side by side"
    )
    parser.add_argument(
        "--output_dir",
        type=Path,
        default=None,
        help="write eval_report.json and predictions_<label>.jsonl here; "
        "labels: before/after with --compare, else eval",
    )
    parser.add_argument("--batch_size", type=int, default=32, help="prompts generated together (default: %(default)s)")
    parser.add_argument(
        "--max_new_tokens", type=int, default=None, help="default: the task's, else the longest reference + 9"
    )
    parser.add_argument("--max_samples", type=int, default=None, help="evaluate only the first N records")
    parser.add_argument(
        "--dtype", default="auto", help="auto (as saved), float32, bfloat16 or float16 (default: %(default)s)"
    )
    return parser


def build_score_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hf_lora_ds.eval score",
        description="Score completions made elsewhere: each record has the task's fields plus a prediction.",
    )
    _add_task_arguments(parser)
    parser.add_argument(
        "--prediction_field", default="prediction", help="field holding the completion (default: %(default)s)"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="per-record verdicts as JSONL (default: DATA.verdicts.jsonl)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    score_mode = bool(argv) and argv[0] == "score"
    parser = build_score_parser() if score_mode else build_parser()
    args = parser.parse_args(
        argv[1:] if score_mode else respell(argv, BASE_MODEL_SPELLINGS, "python -m hf_lora_ds.eval")
    )
    try:
        task = get_task(args.task, **args.task_kwargs)
    except (ValueError, TypeError) as err:
        parser.error(f"--task {args.task} --task_kwargs {json.dumps(args.task_kwargs)}: {err}")
    if not score_mode and args.compare and not args.adapter:
        parser.error("--compare evaluates the base model and base + adapter: pass --adapter DIR")
    return _score(args, task) if score_mode else _evaluate(args, task)


def _score(args: argparse.Namespace, task: Task) -> int:
    result = score_predictions(
        args.data, task, system_prompt=args.system_prompt, prediction_field=args.prediction_field
    )
    output = args.output or args.data.with_suffix(".verdicts.jsonl")
    write_predictions(result, output)
    print(format_comparison({"predictions": result}))
    print(f"accuracy {result.accuracy:.4f} ({result.num_correct}/{result.num_samples}); verdicts written to {output}")
    return 0


def _evaluate(args: argparse.Namespace, task: Task) -> int:
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state = PartialState()  # joins the process group when launched by torchrun; picks this rank's device
    if args.adapter:
        check_adapter_directory(args.adapter, "--adapter")
    check_output_path("--output_dir", args.output_dir)
    records = load_records(args.data)[: args.max_samples]
    load_samples(records, task, args.system_prompt)  # every record checked before a model is loaded
    source, kwargs = model_source(
        args.model_name_or_path, args.gguf_file, "--model_name_or_path", need_tokenizer=not args.tokenizer
    )
    tokenizer_source, tokenizer_flag = (
        (args.tokenizer, "--tokenizer") if args.tokenizer else (args.model_name_or_path, "--model_name_or_path")
    )
    if args.tokenizer:
        check_model_source(args.tokenizer, "--tokenizer", need_weights=False)
    with hub_load_errors(tokenizer_source, tokenizer_flag):
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or source, **({} if args.tokenizer else kwargs))
    with hub_load_errors(args.model_name_or_path, "--model_name_or_path"):
        model = plain_model(AutoModelForCausalLM.from_pretrained(source, dtype=args.dtype, **kwargs)).to(state.device)
    options = dict(batch_size=args.batch_size, system_prompt=args.system_prompt, max_new_tokens=args.max_new_tokens)
    results: dict[str, EvalResult] = {}
    if args.adapter:
        from hf_lora_ds.model.lora import load_adapter

        model = load_adapter(model, args.adapter)
        if args.compare:
            with model.disable_adapter():
                results["before"] = evaluate(model, tokenizer, records, task, **options)
    results["after" if args.compare else "eval"] = evaluate(model, tokenizer, records, task, **options)

    if args.compare:
        logger.info(f"before: {args.model_name_or_path}\nafter:  {args.model_name_or_path} + adapter {args.adapter}")
    print_comparison(results)
    if args.output_dir is not None:
        for label, result in results.items():
            write_predictions(result, args.output_dir / f"predictions_{label}.jsonl")
        write_eval_report(results, args.output_dir / "eval_report.json")
        logger.info(f"predictions and eval_report.json written to {args.output_dir}")
    release_process_group()
    return 0


def cli() -> None:
    """``python -m hf_lora_ds.eval``: a user error is one line on stderr and exit code 2 (hf_lora_ds.errors)."""
    run_cli(main)
