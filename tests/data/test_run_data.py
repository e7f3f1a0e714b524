"""A run's data from its flags: training, ``python -m hf_lora_ds.audit`` and ``python -m hf_lora_ds.plan`` read the
same flags into the same dataset, so the three count the same samples."""

from __future__ import annotations

import json
import re

import pytest

import run_sft
from hf_lora_ds import audit
from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
from hf_lora_ds.cli import plan

REASONING = "First add the tens, then the ones, and check the carry once more before writing it down. " * 3


@pytest.fixture
def thinking_run(qwen3_tokenizer, tmp_path):
    """A thinking model's directory and records whose reasoning is long or empty."""
    model_dir = tmp_path / "model"
    build_tiny_qwen2(qwen3_tokenizer).save_pretrained(model_dir)
    qwen3_tokenizer.save_pretrained(model_dir)
    records = [
        {
            "messages": [
                {"role": "user", "content": f"{x}="},
                {"role": "assistant", "content": f"{x - 1} + 1", "reasoning_content": REASONING if x % 2 else ""},
            ]
        }
        for x in range(10, 30)
    ]
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(json.dumps(record) for record in records))
    return [
        "--model_name_or_path",
        str(model_dir),
        "--train_file",
        str(train),
        "--eval_file",
        "",
        "--dataset_cache_dir",
        str(tmp_path / "cache"),
    ]


def counts(flags: list[str], tmp_path, capsys) -> dict[str, int]:
    """The samples each command reports for ``flags``."""
    audited = audit.main(flags).samples
    capsys.readouterr()
    plan.main(flags)
    planned = int(re.search(r"^data: (\d+) samples", capsys.readouterr().out, re.M).group(1))
    run_sft.main(
        [*flags, "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--per_device_train_batch_size", "4"]
    )
    trained = int(re.search(r"^mask audit: (\d+) samples", capsys.readouterr().out, re.M).group(1))
    return {"audit": audited, "plan": planned, "training": trained}


def test_audit_plan_and_training_count_the_same_samples(thinking_run, tmp_path, capsys):
    # Truncated inside the long reasoning: trained, those samples keep supervised tokens; masked, they have none
    # left and are dropped. A planner that ignored --train_reasoning would count them.
    flags = [*thinking_run, "--max_length", "48", "--train_reasoning", "false"]
    masked = counts(flags, tmp_path, capsys)
    assert masked["audit"] == masked["plan"] == masked["training"] == 10, masked
    trained = counts([*thinking_run, "--max_length", "48"], tmp_path, capsys)
    assert trained["audit"] == trained["plan"] == trained["training"] == 20, trained
