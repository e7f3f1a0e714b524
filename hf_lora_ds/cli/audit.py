"""``python -m hf_lora_ds.audit``: what the model will be trained on, counted over the whole dataset, before a GPU-hour
is spent.

    python -m hf_lora_ds.audit --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --train_file my_train.jsonl
    python -m hf_lora_ds.audit examples/qwen2.5-7b-instruct_zero3_2x24gb.yaml

Takes run_sft.py's flags through the same parser, checks and dataset code as training, so it counts the samples
training will see: the mask audit per source, the train-to-inference round trip, where the LoRA adapters land (on the
meta device: no weight is read) and what the LoRA variant does. ``--show_samples N`` prints samples with their
supervised tokens in [[ ]]; ``--show_samples_format jsonl`` gives one stable JSON object a line (``sample``,
``where``, ``text`` and ``trained``, its trained character spans).
"""

from __future__ import annotations

import argparse
import sys

from hf_lora_ds.cli.log import configure_logging
from hf_lora_ds.config.vision import vision_training
from hf_lora_ds.data.audit import MaskAudit, audit_by_source, audit_dataset, round_trip, show_samples
from hf_lora_ds.data.run_data import load_run_data, sft_dataset
from hf_lora_ds.errors import run_cli
from hf_lora_ds.launch.resolve import read_checked_values
from hf_lora_ds.model.loading import base_model_config, load_run_processor, load_tokenizer
from hf_lora_ds.model.lora import lora_config_from_args
from hf_lora_ds.model.lora_coverage import meta_coverage
from hf_lora_ds.model.lora_variants import variant_line


def main(argv: list[str] | None = None) -> MaskAudit:
    shown, rest = _show_flags().parse_known_args(sys.argv[1:] if argv is None else argv)
    configure_logging(stream="stderr" if shown.show_samples_format == "jsonl" else "stdout")
    args = read_checked_values(rest)
    tokenizer = load_tokenizer(args, need_weights=False)
    processor = load_run_processor(args)  # a vision-language base: its records' images expanded as training does
    data = load_run_data(args.train_file, args, args.dataset)
    dataset = sft_dataset(data, processor.tokenizer if processor is not None else tokenizer, args, processor)
    report = audit_dataset(dataset)
    if shown.show_samples_format == "jsonl":  # stdout is the samples alone, one JSON object a line, for scripts
        print(show_samples(dataset, shown.show_samples, "jsonl"))
        return report
    report.round_trip = round_trip(dataset)
    # The report is the command's output, printed, not logging.
    print(data.summary() + dataset.unused_note())
    print(report)
    if shown.show_samples:
        print("\n" + show_samples(dataset, shown.show_samples))
    if len(dataset.source_counts) > 1:
        for name, source_report in audit_by_source(dataset).items():
            print(f"\n--- source {name} ---\n{source_report}")
    lora = lora_config_from_args(args)
    coverage = meta_coverage(base_model_config(args), lora, args.trust_remote_code, vision_training(args))
    note = coverage.check(
        allow_partial=True, targets=args.lora_target_modules, experts_off=lora.target_parameters == []
    )
    variant = variant_line(lora, args)
    print("\n" + "\n".join([coverage.table(), *([note] if note else []), *([variant] if variant else [])]))
    return report


def _show_flags() -> argparse.ArgumentParser:
    """The audit's own flags; every other argument is run_sft.py's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--show_samples", type=int, default=0, metavar="N", help="print the first N samples too")
    parser.add_argument(
        "--show_samples_format",
        choices=("text", "jsonl"),
        default="text",
        help="text: trained tokens in [[ ]] after the report; jsonl: only the samples, one JSON object "
        "a line (sample, where, text, trained: [start, end] character spans of text)",
    )
    return parser


def cli() -> None:
    """``python -m hf_lora_ds.audit``: a user error is one line on stderr and exit code 2 (hf_lora_ds.errors)."""
    run_cli(main)
