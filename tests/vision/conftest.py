"""What the vision tests share: a folder of tiny images of given sizes, records that refer to them, and each family's
model and records built once for a test module."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm, tiny_image
from hf_lora_ds.data.dataset import ChatSFTDataset


def image_folder(root: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    """``root`` with ``img/NAME`` for each of ``sizes``: a deterministic tiny image of that width and height."""
    (root / "img").mkdir()
    for seed, (name, (width, height)) in enumerate(sizes.items()):
        tiny_image(seed, max(width, height)).resize((width, height)).save(root / "img" / name)
    return root


def write_conversations(root: Path, conversations: list[list[dict]], name: str = "records.jsonl") -> Path:
    """``conversations`` as ``{"messages": ...}`` records, a line each, in ``root / name``."""
    (root / name).write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
    return root / name


def family_and_records(family: str, root: Path) -> tuple:
    """``(model, processor, dataset)``: a tiny model of ``family`` and ``root / "records.jsonl"`` tokenized with its
    processor, cached under ``root``."""
    model, processor = build_tiny_vlm(family)
    records = str(root / "records.jsonl")
    return model, processor, ChatSFTDataset(records, processor.tokenizer, processor=processor, cache_dir=root / "cache")


def once_per_family(build: Callable[[str], tuple]) -> Callable[[str], tuple]:
    """``build(family)``, each family's built once: a module fixture returns this, and what it built goes with the
    fixture at the module's end."""
    return cache(build)
