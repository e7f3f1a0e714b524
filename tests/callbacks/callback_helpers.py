"""Tensor datasets with known token counts, collators (padded, padding-free), a tiny LoRA model, SwanLab run reader.

Shared by the callback tests and ``ddp_run.py``, which torchrun launches as a script.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from hf_lora_ds._testing.tiny_models import build_tiny_qwen2

MIB = 2**20

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


class FakeAllocator:
    """The allocator statistics torch.cuda / torch.accelerator expose, driven by hand (values in MiB)."""

    def __init__(self) -> None:
        self.allocated = self.peak = 0

    def set(self, mib: int) -> None:
        self.allocated = mib * MIB
        self.peak = max(self.peak, self.allocated)

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def max_memory_allocated(self, device=None) -> int:
        return self.peak

    def memory_reserved(self, device=None) -> int:
        return 2 * self.allocated

    def max_memory_reserved(self, device=None) -> int:
        return 2 * self.peak

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.allocated


class FakeClock:
    """A stand-in for ``time.perf_counter`` in hf_lora_ds.callbacks.throughput: every training forward takes exactly
    ``train_s`` and every evaluation forward ``eval_s``, so rates are known numbers. ``attach(model)`` hooks the
    model; ``advance`` adds time by hand (a checkpoint save, say)."""

    def __init__(self, train_s: float = 1.0, eval_s: float = 100.0) -> None:
        self.now, self.train_s, self.eval_s = 1000.0, train_s, eval_s
        self.forwards: list[dict[str, int]] = []  # per training forward: real and padded tokens, rows

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def attach(self, model) -> None:
        model.register_forward_pre_hook(self._forward, with_kwargs=True)

    def _forward(self, module, args, kwargs) -> None:
        if not module.training:
            self.advance(self.eval_s)
            return
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        real = int(mask.sum()) if mask is not None else ids.numel()
        self.forwards.append({"real": real, "padded": ids.numel(), "rows": ids.shape[0]})
        self.advance(self.train_s)


def add_lora(model):
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))


def lora_model(tokenizer):
    return add_lora(build_tiny_qwen2(tokenizer, hidden_size=32, num_hidden_layers=2))


def read_local_runs(log_dir: Path) -> dict[str, list[float]]:
    """Metric name → logged values, from a local-mode log dir (``runs.swanlab`` names each metric's folder)."""
    return {name: [value for _, value in points] for name, points in read_local_points(log_dir).items()}


def read_local_points(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Metric name → ``(step, value)`` in the order SwanLab wrote them, from a local-mode log dir."""
    with sqlite3.connect(log_dir / "runs.swanlab") as db:
        tags = db.execute("SELECT name, folder FROM tag").fetchall()
    (run_dir,) = log_dir.glob("run-*")
    return {
        name: [
            (record["index"], record["data"])
            for log in sorted((run_dir / "logs" / folder).glob("*.log"))
            for record in map(json.loads, log.read_text().splitlines())
        ]
        for name, folder in tags
    }
