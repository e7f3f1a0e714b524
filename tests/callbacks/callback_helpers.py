"""Tensor datasets with known token counts, collators (padded, padding-free), a tiny LoRA model, SwanLab run reader.

Shared by the callback tests and ``ddp_run.py``, which torchrun launches as a script.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from hf_lora_ds.tiny import build_tiny_qwen2

# all different, so every batch of two is padded
LENGTHS = [5, 12, 7, 9, 11, 6, 8, 10]


class TokenDataset(torch.utils.data.Dataset):
    """Sequences of the given lengths; the first half of each is masked (-100) in the labels."""

    def __init__(self, lengths: list[int], vocab_size: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.rows = []
        for length in lengths:
            ids = torch.randint(3, vocab_size, (length,), generator=generator)
            labels = ids.clone()
            labels[: length // 2] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]

    def real_tokens(self) -> int:
        return sum(len(r["input_ids"]) for r in self.rows)

    def supervised_tokens(self) -> int:
        return sum(int((r["labels"] != -100).sum()) for r in self.rows)


def pad_collate(batch: list[dict[str, torch.Tensor]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    width = max(len(row["input_ids"]) for row in batch)
    ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        n = len(row["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = row["input_ids"], row["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def flat_collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Padding-free: one row, position_ids restarting at 0 for each sequence, no attention mask."""
    return {
        "input_ids": torch.cat([r["input_ids"] for r in batch])[None],
        "labels": torch.cat([r["labels"] for r in batch])[None],
        "position_ids": torch.cat([torch.arange(len(r["input_ids"])) for r in batch])[None],
    }


def add_lora(model):
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))


def lora_model(tokenizer):
    return add_lora(build_tiny_qwen2(tokenizer, hidden_size=32, num_hidden_layers=2))


def read_local_runs(log_dir: Path) -> dict[str, list[float]]:
    """Metric name → logged values, from a local-mode log dir (``runs.swanlab`` names each metric's folder)."""
    with sqlite3.connect(log_dir / "runs.swanlab") as db:
        tags = db.execute("SELECT name, folder FROM tag").fetchall()
    (run_dir,) = log_dir.glob("run-*")
    return {
        name: [
            json.loads(line)["data"]
            for log in sorted((run_dir / "logs" / folder).glob("*.log"))
            for line in log.read_text().splitlines()
        ]
        for name, folder in tags
    }
