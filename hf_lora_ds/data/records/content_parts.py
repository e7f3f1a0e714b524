"""A message's content given as a list of typed parts, as OpenAI, Hugging Face and LLaMA-Factory v1 write it.

Text parts (``"text"`` or LLaMA-Factory's ``"value"``) are joined in order, with nothing between, into the one string
the chat template writes and the label rule locates; reasoning and tool-call parts (LLaMA-Factory v1's ``tool_call``,
one call as JSON) become ``reasoning_content`` and ``tool_calls``. A part this text-only package cannot train on
(image, audio, file) is refused rather than dropped from a turn whose answer may refer to it. A template that
iterates parts itself gets them as written (``PARTS_KEY``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.tool_calls import tool_call_json

__all__ = ["PARTS_KEY", "Parts", "drop_parts", "join_parts"]

PARTS_KEY = "content_parts"  # a message's text parts as given, for a template that iterates them

_TEXT_KEYS = ("text", "value")  # OpenAI / HF, LLaMA-Factory v1
_CALL_KINDS = ("tool_call", "tool_calls")  # LLaMA-Factory v1 writes one call a part, as JSON


@dataclass
class Parts:
    """What a list of parts holds: the joined text, the joined reasoning, and the tool calls (raw, validated later)."""

    text: str = ""
    reasoning: str = ""
    calls: list[Any] = field(default_factory=list)
    # Every part as given with its field name, and for a text part where its text stands in ``text`` (axolotl's
    # per-part ``train`` flags are read from them, ``hf_lora_ds.data.formats``).
    placed: list[tuple[dict, str, tuple[int, int] | None]] = field(default_factory=list)


def drop_parts(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the parts kept beside its joined text."""
    if PARTS_KEY not in message:
        return message
    return {key: value for key, value in message.items() if key != PARTS_KEY}


def join_parts(parts: list[Any], where: str, name: str) -> Parts:
    """The parts of ``name`` (``messages[1].content``) read in order; a part that is no text is refused."""
    joined = Parts()
    texts, reasoning, at = [], [], 0
    for j, part in enumerate(parts):
        label = f"{name}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise DataError(f'{where}: field \'{label}\' must be a part object such as {{"type": "text", "text": ...}}')
        kind = part["type"]
        if kind not in ("text", "reasoning", *_CALL_KINDS):
            raise DataError(
                f"{where}: field '{label}': a {kind!r} part; only text, reasoning and tool-call parts can be trained "
                "on here (this package trains text-only models): drop the part or the record"
            )
        value = _part_value(part, where, label)
        joined.placed.append((part, label, (at, at + len(value)) if kind == "text" else None))
        if kind == "text":
            texts.append(value)
            at += len(value)
        elif kind == "reasoning":
            reasoning.append(value)
        else:
            joined.calls += _calls(value, where, label)
    joined.text, joined.reasoning = "".join(texts), "".join(reasoning)
    return joined


def _part_value(part: dict, where: str, label: str) -> str:
    for key in _TEXT_KEYS:
        if key in part and part[key] is not None:
            if not isinstance(part[key], str):
                raise DataError(f"{where}: field '{label}.{key}' must be a string, got {type(part[key]).__name__}")
            return part[key]
    raise DataError(f"{where}: field '{label}': a {part['type']!r} part needs 'text' (or 'value')")


def _calls(value: str, where: str, label: str) -> list[Any]:
    """LLaMA-Factory v1's tool-call part: one call or a list of them, as JSON; each becomes an OpenAI-style call."""
    calls = tool_call_json(value, where, f"{label}.value")
    calls = calls if isinstance(calls, list) else [calls]
    return [{"function": call} if isinstance(call, dict) and "function" not in call else call for call in calls]
