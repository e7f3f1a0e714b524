"""report.html lists the arguments a run changed first, and only those; the rest come after, folded."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import TrainingArguments

from hf_lora_ds import SFTTrainingArguments
from hf_lora_ds.report import write_report
from hf_lora_ds.report.argument_table import declared_defaults, split_arguments

DATA = Path(__file__).resolve().parents[2] / "data"


def _table_keys(html: str, table_id: str) -> list[str]:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S)
    assert table, f"no table {table_id}"
    return re.findall(r'<tr><td class="key">([^<]+)</td>', table.group(1))


def _report(args: TrainingArguments, tmp_path: Path) -> str:
    path = write_report(tmp_path, [], arguments=args.to_dict(), argument_defaults=declared_defaults(args))
    return path.read_text(encoding="utf-8")


def test_changed_arguments_come_first_and_alone(tmp_path):
    args = SFTTrainingArguments(
        output_dir=str(tmp_path / "run"),
        model_name_or_path=str(DATA / "tiny-qwen2-sum"),
        train_file=str(DATA / "sum_to_x" / "train.json"),
        learning_rate=3e-3,
        lora_rank=4,
        lr_scheduler_type="cosine",
        use_cpu=True,
        report_to="none",  # set, but to its default: not a change
    )
    html = _report(args, tmp_path)
    changed = _table_keys(html, "changed-arguments")
    assert changed == sorted(
        [
            "output_dir",
            "model_name_or_path",
            "train_file",
            "learning_rate",
            "lora_rank",
            "lr_scheduler_type",
            "use_cpu",
            "dtype",  # "auto" resolved to float32: shown next to its default
            "batching",  # "auto" resolved to padded (sdpa): shown next to its default
            "dataloader_pin_memory",  # off, as pinning does nothing without an accelerator
        ]
    )
    others = _table_keys(html, "other-arguments")
    assert html.index('id="changed-arguments"') < html.index('id="other-arguments"')
    assert html.index("<details") < html.index('id="other-arguments"')  # folded
    assert not set(changed) & set(others)
    assert set(changed) | set(others) == set(args.to_dict())
    # what __post_init__ or to_dict rewrites without a user asking is not a change
    for key in ("report_to", "debug", "gradient_checkpointing", "accelerator_config", "hub_token", "adam_beta1"):
        assert key in others, key


def test_defaults_alone_change_nothing_but_the_output_dir():
    args = TrainingArguments(output_dir="out")
    changed, unchanged = split_arguments(args.to_dict(), declared_defaults(args))
    assert changed == {"output_dir": ("out", None)}
    assert len(unchanged) > 100


def test_zero_is_not_unset():
    changed, _ = split_arguments({"max_grad_norm": 0.0, "seed": 0}, {"max_grad_norm": None, "seed": 42})
    assert changed == {"max_grad_norm": (0.0, None), "seed": (0, 42)}


def test_without_defaults_all_arguments_are_listed_open(tmp_path):
    html = write_report(tmp_path, [], arguments={"lora_r": 8, "learning_rate": 1e-3}).read_text(encoding="utf-8")
    assert 'id="changed-arguments"' not in html
    assert _table_keys(html, "other-arguments") == ["learning_rate", "lora_r"]
    assert "<details open>" in html
