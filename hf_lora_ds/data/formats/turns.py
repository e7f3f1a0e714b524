"""The one validator of turns, whatever format they came in, and what one record's reading gathers besides them.

Every format's turns go through ``Reading.messages``, so a bad turn gets the same message, naming the record's
location and the user's field, whatever the other turns hold: roles as in ``ROLES``, a system turn only first, content
a non-empty string (or a list of parts: ``hf_lora_ds.data.records.content_parts``) except beside tool calls, reasoning
only on assistant turns, training flags (``hf_lora_ds.data.masking.turn_flags``) and image parts by message index, and
the message keys no reader uses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from hf_lora_ds.data.masking.turn_flags import DETAIL_KEY, FLAG_KEYS, message_flag, train_detail
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.content_parts import IMAGE_KINDS, PARTS_KEY, Parts, join_parts
from hf_lora_ds.data.records.tool_calls import tool_call, tool_schemas

if TYPE_CHECKING:
    from hf_lora_ds.data.formats.columns import FieldNames, FormatOptions

__all__ = ["ROLES", "USED_TURN_KEYS", "Reading", "string_field", "unused_keys", "validated"]

ROLES = ("system", "user", "assistant", "tool")
_PLAIN_KEYS = frozenset(("role", "content"))
USED_MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "reasoning_content", DETAIL_KEY, *FLAG_KEYS}
USED_TURN_KEYS = {"reasoning_content", DETAIL_KEY, *FLAG_KEYS}  # and the speaker and text keys


class Reading:
    """One record being read: where it is (``where``), the names the user gave its fields (``names``), the options
    it is read with, whether the run's model takes images (``images``), and what its turns say besides role and
    content, gathered while they are validated: training flags and spans by message index, the images their parts
    hold (``image_parts``, one ``(image, field)`` per mark of the message's text, for
    ``hf_lora_ds.data.formats.images``), the first message of a TRL completion, and the message keys nothing reads."""

    __slots__ = (
        "where",
        "names",
        "options",
        "images",
        "offset",
        "flags",
        "detail",
        "image_parts",
        "completion_from",
        "unused",
    )

    def __init__(self, where: str, names: FieldNames, options: FormatOptions, images: bool = False):
        self.where = where
        self.names = names
        self.options = options
        self.images = images
        self.offset = 0  # index of the list being read within the conversation (a TRL completion follows its prompt)
        self.flags: dict[int, bool] = {}
        self.detail: dict[int, list[tuple[int, int, bool]]] = {}
        self.image_parts: dict[int, list[tuple[Any, str]]] = {}
        self.completion_from = 0
        self.unused: list[str] = []

    def string(self, record: dict, name: str, *, required: bool = True, allow_empty: bool = False) -> str:
        """``record[name]`` as a string, refused naming the field as the user wrote it (a ``--columns`` column)."""
        return string_field(
            record, name, self.where, required=required, allow_empty=allow_empty, label=self.names[name]
        )

    def tools(self, record: dict) -> list[dict] | None:
        """The record's tool schemas (``hf_lora_ds.data.records.tool_calls``), None without any."""
        return tool_schemas(record["tools"], self.where, self.names["tools"]) if "tools" in record else None

    def messages(
        self,
        messages: Any,
        list_name: str,
        validate_calls: bool = True,
        content_field: str = "content",
        *,
        need_assistant: bool = True,
        system_first: bool = True,
    ) -> list[dict[str, Any]]:
        """The validated turns of ``messages``, with some assistant turn (unless ``need_assistant`` is off: a TRL
        prompt). ``list_name`` and ``content_field`` are the record's own names (``conversations`` / ``value`` for
        ShareGPT), so errors point at the field the user wrote. ``system_first`` off: the list continues a
        conversation (a TRL completion), so no turn of it may be a system turn."""
        where = self.where
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: field '{list_name}' must be a non-empty list of {{role, content}} objects")
        result = []
        for i, message in enumerate(messages):
            if _plain_turn(message, first=i == 0 and system_first):
                result.append({"role": message["role"], "content": message["content"]})
                continue
            name = f"{list_name}[{i}]"
            if not isinstance(message, dict):
                raise DataError(f"{where}: field '{name}' must be an object with 'role' and 'content'")
            role = string_field(message, "role", where, label=f"{name}.role")
            if role not in ROLES:
                raise DataError(f"{where}: field '{name}.role': unknown role {role!r}; use one of {list(ROLES)}")
            if role == "system" and (i != 0 or not system_first):
                raise DataError(f"{where}: field '{name}.role': a system turn may only come first")
            result.append(self._turn(message, role, i, name, list_name, validate_calls, content_field))
        if need_assistant and not any(m["role"] == "assistant" for m in result):
            raise DataError(f"{where}: field '{list_name}': no assistant turn, so there is nothing to train on")
        return result

    def _turn(
        self, message: dict, role: str, i: int, name: str, list_name: str, validate_calls: bool, content_field: str
    ) -> dict[str, Any]:
        """A turn that is more than a role and a text: its parts, tool calls, reasoning, flags and unused keys."""
        where, given = self.where, message.get("content")
        message, images = _parts_read(message, role, where, f"{name}.{content_field}", self.images)
        if self.images and isinstance(given, list):  # its marks are its parts', a placeholder split by them too
            self.image_parts[self.offset + i] = images
        calls = message.get("tool_calls") or []
        if calls and role != "assistant":
            raise DataError(f"{where}: field '{name}.tool_calls': only assistant turns make tool calls")
        content = (
            ""
            if calls and message.get("content") is None
            else string_field(message, "content", where, allow_empty=bool(calls), label=f"{name}.{content_field}")
        )
        out: dict[str, Any] = {"role": role, "content": content, **_reasoning(message, role, where, name)}
        if isinstance(given, list):  # for a template that iterates the parts itself (data.records.content_parts)
            out[PARTS_KEY] = _template_parts(given)
        if role == "tool" and message.get("tool_call_id") is not None:  # Mistral's templates write it
            out["tool_call_id"] = string_field(message, "tool_call_id", where, label=f"{name}.tool_call_id")
        if calls:
            if not isinstance(calls, list):
                raise DataError(f"{where}: field '{name}.tool_calls' must be a list")
            out["tool_calls"] = [
                tool_call(call, where, f"{name}.tool_calls[{j}]") if validate_calls else call
                for j, call in enumerate(calls)
            ]
        flag = message_flag(message, role, where, name)
        if flag is not None:
            self.flags[self.offset + i] = flag
        detail = train_detail(message, content, role, where, name)
        if detail is not None:
            self.detail[self.offset + i] = detail
        self.unused += unused_keys(message, USED_MESSAGE_KEYS, list_name)
        return out

    def shift(self, by: int) -> None:
        """Message indices after a system turn was put first."""
        self.flags = {i + by: v for i, v in self.flags.items()}
        self.detail = {i + by: v for i, v in self.detail.items()}
        self.image_parts = {i + by: v for i, v in self.image_parts.items()}
        self.completion_from += by if self.completion_from else 0

    def move_spans(self, index: int, by: int) -> None:
        """Message ``index``'s ``train_detail`` spans after ``by`` characters were put before its text."""
        if index in self.detail:
            self.detail[index] = [(begin + by, end + by, train) for begin, end, train in self.detail[index]]

    def fields(self) -> dict[str, Any]:
        """``flags``, ``detail`` and ``completion_from``, those the record has."""
        found = {"flags": self.flags, "detail": self.detail, "completion_from": self.completion_from}
        return {key: value for key, value in found.items() if value}


def validated(convert: Callable[[dict, Reading], dict], name: str) -> Callable[[dict, Reading], dict]:
    """A user's converter whose conversation is validated as the built-ins' turns are, errors saying which format
    made it; a plain-text one (``{"text", "prompt_chars"}``) needs a non-empty text."""

    @wraps(convert)  # its source still keys the dataset cache (registry.fingerprint)
    def convert_validated(record: dict, reading: Reading) -> dict:
        made = convert(record, reading)
        if not isinstance(made, dict) or not ("messages" in made or "text" in made):
            raise TypeError(
                f"record format {name!r} returned {type(made).__name__}; a converter returns "
                '{"messages": [...], "tools": [...] | None} or {"text": str, "prompt_chars": int}'
            )
        reading.where = f"{reading.where} (format {name!r})"
        if "text" in made:
            text, prompt_chars = string_field(made, "text", reading.where), made.get("prompt_chars", 0)
            if type(prompt_chars) is not int or not 0 <= prompt_chars <= len(text):
                raise DataError(f"{reading.where}: 'prompt_chars' must be a character count within the text")
            return {"text": text, "prompt_chars": prompt_chars, "messages": None, "tools": None}
        tools = tool_schemas(made.get("tools"), reading.where, "tools")
        return {"messages": reading.messages(made["messages"], "messages"), "tools": tools}

    return convert_validated


def unused_keys(message: dict, used: set[str], list_name: str) -> list[str]:
    """The keys of a message that no reader uses, as ``messages[].name``; a null one is an absent one (Arrow gives
    every message of a column every key any message has)."""
    return [f"{list_name}[].{key}" for key in message.keys() - used if message[key] is not None]


def _plain_turn(message: Any, first: bool) -> bool:
    """Whether ``message`` is a valid turn of a role and a non-blank text and nothing else: most turns, which need no
    more reading (no parts, calls, reasoning, flags or unused keys), so the validator takes them as they are."""
    if type(message) is not dict or not message.keys() <= _PLAIN_KEYS:
        return False
    role, content = message.get("role"), message.get("content")
    return role in ROLES and (first or role != "system") and type(content) is str and content.strip() != ""


def _template_parts(given: list[dict]) -> list[dict]:
    """The parts a template that iterates them is given: the text parts as ``{"type": "text", "text"}`` and each image
    as a data-less ``{"type": "image"}`` where it stands (its image is the conversation's, in mark order)."""
    parts = []
    for part in given:
        if part["type"] == "text":
            parts.append(part if "text" in part else {**part, "text": part["value"]})  # LLaMA-Factory v1's
        elif part["type"] in IMAGE_KINDS:  # only where the run takes images: join_parts refused them otherwise
            parts.append({"type": "image"})
    return parts


def _parts_read(message: dict, role: str, where: str, name: str, images: bool) -> tuple[dict, list[tuple[Any, str]]]:
    """A message whose content is a list of parts, as one with their text joined (images as ``IMAGE_MARK``), their
    reasoning as ``reasoning_content``, their tool calls added to its ``tool_calls``
    (``hf_lora_ds.data.records.content_parts``) and their training flags (axolotl's per-part ``train``) as the
    ``train_detail`` of the text they cover; and the images its marks stand for."""
    content = message.get("content")
    if not isinstance(content, list):
        return message, []
    parts = join_parts(content, where, name, images)
    joined = {**message, "content": parts.text}
    if detail := _part_flags(parts, role, where):
        if message.get(DETAIL_KEY) is not None:
            raise DataError(f"{where}: field '{name}': training flags on its parts and a {DETAIL_KEY}; give one")
        joined[DETAIL_KEY] = detail
    if parts.reasoning and not message.get("reasoning_content"):
        joined["reasoning_content"] = parts.reasoning
    if parts.calls:
        joined["tool_calls"] = [*(message.get("tool_calls") or []), *parts.calls]
    return joined, parts.images


def _part_flags(parts: Parts, role: str, where: str) -> list[dict[str, Any]]:
    """The parts' training flags as ``train_detail`` spans of the joined text (offsets inclusive, as axolotl
    counts them); a flag on a part that is no text has no characters to switch and is refused."""
    detail = []
    for part, label, span in parts.placed:
        flag = message_flag(part, role, where, label)
        if flag is not None and span is None:
            raise DataError(f"{where}: field '{label}': a training flag on a {part['type']!r} part; flag text parts")
        if flag is not None and span[1] > span[0]:
            detail.append({"begin_offset": span[0], "end_offset": span[1] - 1, "train": flag})
    return detail


def _reasoning(message: dict, role: str, where: str, name: str) -> dict[str, str]:
    """``{"reasoning_content": ...}`` for an assistant message that carries its reasoning, else ``{}``."""
    reasoning = message.get("reasoning_content")
    if reasoning is None or reasoning == "":
        return {}
    if not isinstance(reasoning, str):
        raise DataError(f"{where}: field '{name}.reasoning_content' must be a string, got {type(reasoning).__name__}")
    if role != "assistant":
        raise DataError(f"{where}: field '{name}.reasoning_content': only assistant turns carry reasoning")
    return {"reasoning_content": reasoning}


def string_field(
    obj: dict, name: str, where: str, *, required: bool = True, allow_empty: bool = False, label: str | None = None
) -> str:
    """``obj[name]`` as a string; ``label`` is the field as the user wrote it (``messages[2].content``)."""
    label = label or name
    value = obj.get(name)
    if value is None:
        if required:
            raise DataError(f"{where}: missing field '{label}'")
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{label}' must be a string, got {type(value).__name__} ({value!r:.40})")
    if not allow_empty and not value.strip():
        raise DataError(f"{where}: field '{label}' is empty")
    return value
