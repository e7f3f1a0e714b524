"""Eval fixtures: sum-to-x records."""

from __future__ import annotations

import json

import pytest


def sum_record(x: int, a: int, prompt_repeat: int = 1) -> dict[str, str]:
    """A sum-to-x record; ``prompt_repeat`` lengthens the instruction (x stays the last ``{x}=``) to vary lengths."""
    return {"instruction": f"{x}=" * prompt_repeat, "input": "", "output": f"王大丫丫的回答是--->{a} + {x - a}"}


@pytest.fixture
def sum_records() -> list[dict[str, str]]:
    return [sum_record(10 + 7 * i, 1 + i % 9, 1 + i % 4) for i in range(13)]


@pytest.fixture
def sum_records_file(tmp_path, sum_records):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(sum_records, ensure_ascii=False, indent=1), encoding="utf-8")
    return path
