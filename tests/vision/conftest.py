"""What the vision tests share: a folder of tiny images of given sizes, and records that refer to them."""

from __future__ import annotations

import json
from pathlib import Path

from hf_lora_ds._testing.tiny_vlms import tiny_image


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
