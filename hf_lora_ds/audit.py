"""``python -m hf_lora_ds.audit``: what the model will be trained on, counted over the whole dataset, before a GPU-hour
is spent.

    python -m hf_lora_ds.audit --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --train_file my_train.jsonl
    python -m hf_lora_ds.audit examples/qwen2.5-7b-instruct_zero3_2x24gb.yaml

Takes run_sft.py's own flags (or its YAML/JSON file, then flags; what is set nowhere is the demo's) through the same
parser and checks, and builds the tokenizer and the dataset through the same functions as training, so it counts the
samples training will see. Prints the mask audit of ``--train_file`` (hf_lora_ds.data.mask_audit, one per source of a
mixture), the train-to-inference round trip of every record (hf_lora_ds.data.inference_prompts), where the LoRA
adapters would land (built from the model's config on the meta device: no weight is read) and what the LoRA variant
does (hf_lora_ds.model.lora_variants: an init that rewrites the base, a data pass, LoRA+ or LoRA-FA).
"""

from __future__ import annotations

import sys

from hf_lora_ds.data.inference_prompts import round_trip
from hf_lora_ds.data.mask_audit import MaskAudit, audit_by_source, audit_dataset
from hf_lora_ds.data.run_data import load_run_data, sft_dataset
from hf_lora_ds.errors import run_cli
from hf_lora_ds.launch.cli import read_checked_values
from hf_lora_ds.model.loading import base_model_config, load_tokenizer
from hf_lora_ds.model.lora import lora_config_from_args
from hf_lora_ds.model.lora_coverage import meta_coverage
from hf_lora_ds.model.lora_variants import variant_line


def main(argv: list[str] | None = None) -> MaskAudit:
    args = read_checked_values(sys.argv[1:] if argv is None else argv)
    tokenizer = load_tokenizer(args, need_weights=False)
    data = load_run_data(args.train_file, args)
    dataset = sft_dataset(data, tokenizer, args)
    report = audit_dataset(dataset)
    report.round_trip = round_trip(dataset)
    print(data.summary() + dataset.unused_note())
    print(report)
    if len(dataset.source_counts) > 1:
        for name, source_report in audit_by_source(dataset).items():
            print(f"\n--- source {name} ---\n{source_report}")
    coverage = meta_coverage(base_model_config(args), args.lora_target_modules, args.trust_remote_code)
    note = coverage.check(allow_partial=True, targets=args.lora_target_modules)
    variant = variant_line(lora_config_from_args(args), args)
    print("\n" + "\n".join([coverage.table(), *([note] if note else []), *([variant] if variant else [])]))
    return report


if __name__ == "__main__":
    run_cli(main)
