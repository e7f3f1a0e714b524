"""TRL's language-modeling kind: one ``text``, trained whole as TRL trains it, with no chat template
(``hf_lora_ds.data.masking.plain_text``)."""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.formats.registry import RecordFormat
from hf_lora_ds.data.formats.turns import Reading

__all__ = ["TEXT"]


def text(record: dict, reading: Reading) -> dict[str, Any]:
    return {"text": reading.string(record, "text"), "prompt_chars": 0, "messages": None, "tools": None}


TEXT = RecordFormat("text", fields=("text",), convert=text, describe="'text' (TRL language modeling)")
