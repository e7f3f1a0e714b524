"""ShareGPT, as LLaMA-Factory and axolotl write it: ``conversations`` of ``{from, value}`` turns (the speaker names
``SHAREGPT_ROLES`` knows, or ``--sharegpt_roles``), an optional ``system`` and ``tools``; a ``function_call`` turn
holds a tool call as JSON, an ``observation`` turn its result."""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.formats.columns import SHAREGPT_ROLES
from hf_lora_ds.data.formats.registry import RecordFormat
from hf_lora_ds.data.formats.turns import USED_TURN_KEYS, Reading, unused_keys
from hf_lora_ds.data.masking.turn_flags import DETAIL_KEY, FLAG_KEYS
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.tool_calls import sharegpt_call

__all__ = ["SHAREGPT"]


def sharegpt(record: dict, reading: Reading) -> dict[str, Any]:
    tools = reading.tools(record)
    return {"messages": _messages(record, reading), "tools": tools}


def _messages(record: dict, reading: Reading) -> list[dict[str, Any]]:
    """ShareGPT turns as messages; a ``function_call`` turn becomes an assistant turn carrying that tool call."""
    where, names, options = reading.where, reading.names, reading.options
    roles, (role_key, text_key) = {**SHAREGPT_ROLES, **options.sharegpt_roles}, options.turn_keys
    used = USED_TURN_KEYS | {role_key, text_key}
    turns, list_name = record["conversations"], names["conversations"]
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: field '{list_name}' must be a non-empty list of {{{role_key}, {text_key}}} objects")
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        name = f"{list_name}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(f"{where}: field '{name}' must be an object with '{role_key}' and '{text_key}'")
        speaker, value = turn.get(role_key), turn.get(text_key)
        if speaker not in roles:
            raise DataError(
                f"{where}: field '{name}.{role_key}': unknown speaker {speaker!r}; use one of {sorted(roles)} "
                "or map it with --sharegpt_roles NAME=ROLE"
            )
        if not isinstance(value, str):
            raise DataError(f"{where}: field '{name}.{text_key}' must be a string, got {type(value).__name__}")
        role = roles[speaker]
        # The turn's own extras travel with it to the one validator: reasoning, training flags and spans.
        extras = {key: turn[key] for key in ("reasoning_content", DETAIL_KEY, *FLAG_KEYS) if key in turn}
        reading.unused += unused_keys(turn, used, list_name)
        if role == "function_call":
            call = sharegpt_call(value, where, name)
            messages.append({"role": "assistant", "content": "", "tool_calls": [call], **extras})
        else:
            messages.append({"role": role, "content": value, **extras})
    messages = reading.messages(messages, list_name, validate_calls=False, content_field=text_key)
    system = record.get("system")
    if system:  # prepended after validation, so errors index the record's own turns
        if not isinstance(system, str):
            raise DataError(f"{where}: field '{names['system']}' must be a string, got {type(system).__name__}")
        if messages[0]["role"] == "system":
            raise DataError(
                f"{where}: field '{names['system']}': {list_name}[0] is a system turn already; keep one of them"
            )
        messages.insert(0, {"role": "system", "content": system})
        reading.shift(1)
    return messages


SHAREGPT = RecordFormat(
    "sharegpt",
    fields=("conversations",),
    convert=sharegpt,
    reads=frozenset({"conversations", "system", "tools", "images"}),
    describe="'conversations' (ShareGPT)",
)
