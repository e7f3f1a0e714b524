"""A message's content given as a list of typed parts, as OpenAI, Hugging Face and LLaMA-Factory v1 write it.

Text parts (``"text"`` or LLaMA-Factory's ``"value"``) are joined in order, with nothing between, into the one string
the chat template writes and the label rule locates; reasoning and tool-call parts (LLaMA-Factory v1's ``tool_call``,
one call as JSON) become ``reasoning_content`` and ``tool_calls``. An image part (Hugging Face's ``image``, OpenAI's
``image_url``) stands in the joined text as ``IMAGE_MARK``, where it stood, when the run's model takes images; for a
text-only model it is refused, like audio or file parts always are, rather than dropped from a turn whose answer may
refer to it. A template that iterates parts itself gets them as written (``PARTS_KEY``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.tool_calls import tool_call_json

__all__ = ["IMAGE_KINDS", "IMAGE_MARK", "PARTS_KEY", "Parts", "drop_parts", "join_parts"]

PARTS_KEY = "content_parts"  # a message's text parts as given, for a template that iterates them
# Where an image stands in a message's text: LLaVA's, ms-swift's and LLaMA-Factory's placeholder, so their records
# need no rewriting and every other shape is written the same way (``hf_lora_ds.data.formats.images``).
IMAGE_MARK = "<image>"

_TEXT_KEYS = ("text", "value")  # OpenAI / HF, LLaMA-Factory v1
_CALL_KINDS = ("tool_call", "tool_calls")  # LLaMA-Factory v1 writes one call a part, as JSON
IMAGE_KINDS = ("image", "image_url", "input_image")  # Hugging Face / TRL, OpenAI chat, OpenAI responses
# Where an image part holds its image, by kind: TRL's "image", Hugging Face's "path" / "url", LLaMA-Factory v1's
# "value"; OpenAI's "image_url" (an object with its "url", or the URL itself). None of them: TRL's data-less part.
_IMAGE_KEYS = {"image": ("image", "path", "url", "value"), "image_url": ("image_url",), "input_image": ("image_url",)}


@dataclass
class Parts:
    """What a list of parts holds: the joined text, the joined reasoning, and the tool calls (raw, validated later)."""

    text: str = ""
    reasoning: str = ""
    calls: list[Any] = field(default_factory=list)
    # One ``(image, field)`` per ``IMAGE_MARK`` of ``text``, in order: what an image part holds (None for TRL's
    # data-less part, and for a placeholder written in a text part: both take the record's ``images`` in turn).
    images: list[tuple[Any, str]] = field(default_factory=list)
    # Every part as given with its field name, and for a text part where its text stands in ``text`` (axolotl's
    # per-part ``train`` flags are read from them, ``hf_lora_ds.data.formats``).
    placed: list[tuple[dict, str, tuple[int, int] | None]] = field(default_factory=list)


def drop_parts(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the parts kept beside its joined text."""
    if PARTS_KEY not in message:
        return message
    return {key: value for key, value in message.items() if key != PARTS_KEY}


def join_parts(parts: list[Any], where: str, name: str, images: bool = False) -> Parts:
    """The parts of ``name`` (``messages[1].content``) read in order; a part that is no text is refused, unless it is
    an image and ``images`` (the run's model takes images) says so."""
    joined = Parts()
    texts, reasoning, at = [], [], 0
    for j, part in enumerate(parts):
        label = f"{name}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise DataError(f'{where}: field \'{label}\' must be a part object such as {{"type": "text", "text": ...}}')
        kind = part["type"]
        if kind in IMAGE_KINDS and images:
            joined.images.append((_image_value(part, where, label), label))
            joined.placed.append((part, label, None))
            texts.append(IMAGE_MARK)
            at += len(IMAGE_MARK)
            continue
        if kind not in ("text", "reasoning", *_CALL_KINDS):
            raise DataError(f"{where}: field '{label}': a {kind!r} part; {_trainable_parts(kind, images)}")
        value = _part_value(part, where, label)
        joined.placed.append((part, label, (at, at + len(value)) if kind == "text" else None))
        if kind == "text":
            texts.append(value)
            at += len(value)
            if images:  # a placeholder written in the text: LLaVA's way, inside OpenAI's parts
                joined.images += [(None, f"{label}.text")] * value.count(IMAGE_MARK)
        elif kind == "reasoning":
            reasoning.append(value)
        else:
            joined.calls += _calls(value, where, label)
    joined.text, joined.reasoning = "".join(texts), "".join(reasoning)
    return joined


def _trainable_parts(kind: str, images: bool) -> str:
    """What the refusal of a part says can be trained on, and why this one cannot."""
    if kind in IMAGE_KINDS:
        return (
            "this model is text-only (it has no image processor), so it cannot be trained on images: train a "
            "vision-language model, or drop the part or the record"
        )
    media = "text, image" if images else "text"
    return f"only {media}, reasoning and tool-call parts can be trained on here: drop the part or the record"


def _image_value(part: dict, where: str, label: str) -> Any:
    """What an image part holds: a path, URL, ``data:`` URI, bytes dict or PIL image (resolved later, where the
    record's folder is known); None for TRL's data-less ``{"type": "image"}``, which takes the record's ``images``."""
    kind = part["type"]
    key = next((key for key in _IMAGE_KEYS[kind] if part.get(key) is not None), None)
    if key is None:
        if kind != "image":
            raise DataError(f"{where}: field '{label}': an {kind!r} part needs 'image_url' (a URL, path or data URI)")
        return None
    value = part[key]
    if kind != "image" and isinstance(value, dict):  # OpenAI: {"image_url": {"url": ...}}
        if not isinstance(value.get("url"), str):
            raise DataError(f"{where}: field '{label}.image_url' must hold a 'url' string")
        return value["url"]
    return value


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
