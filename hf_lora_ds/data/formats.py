"""What a record must hold, in every format it may come in, converted to one validated conversation.

Users bring SFT data in the shape it was published in. Rather than asking for a conversion script, each record is
recognised by its fields and turned into ``{"messages": [...], "tools": [...] | None}``:

- alpaca: ``{"instruction", "input" (optional, joined to the instruction with a newline), "output",
  "system" (optional), "reasoning" (optional: the output's reasoning)}``;
- messages: ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]}``;
- ShareGPT: ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}], "system": ..., "tools": ...}``
  (``from`` names are mapped to roles by ``SHAREGPT_ROLES``, extendable with ``--sharegpt_roles``);
- tool calling: ``messages`` whose assistant turns carry ``tool_calls`` and whose ``tool`` turns hold the results,
  with a ``tools`` list (JSON schemas) per record, rendered by the model's own chat template;
- any other column names, mapped onto the known fields with ``--columns prompt=question,response=answer``.

Assistant turns may carry reasoning for thinking models: ``reasoning_content`` on a message or ShareGPT turn,
``<think>...</think>`` inside the content, or alpaca's ``reasoning`` field (``--columns reasoning=thought``).

Every turn of every format goes through one validator (``_messages``), so a bad turn gets the same message whatever
the record's other turns hold; every error names the record's location and the field the user wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hf_lora_ds.data.records import DataError

__all__ = [
    "FormatOptions",
    "ROLES",
    "SHAREGPT_ROLES",
    "COLUMN_ALIASES",
    "parse_mapping",
    "to_conversation",
    "to_messages",
]

ROLES = ("system", "user", "assistant", "tool")
# ShareGPT ``from`` values as LLaMA-Factory and axolotl write them.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "function_call": "function_call",  # an assistant turn whose value is a JSON tool call
    "observation": "tool",
    "tool": "tool",
}
# --columns keys that are other names for the alpaca fields.
COLUMN_ALIASES = {"prompt": "instruction", "query": "instruction", "response": "output"}
KNOWN_FIELDS = ("instruction", "input", "output", "system", "reasoning", "messages", "conversations", "tools")
FORMAT_FIELDS = ("instruction", "messages", "conversations")  # a record with one of them has a known format
ALPACA_FIELDS = {"instruction", "output"}  # both required in an alpaca record


@dataclass(frozen=True)
class FormatOptions:
    """How records are read: ``columns`` maps a known field to the dataset's column, ``sharegpt_roles`` adds or
    overrides ShareGPT ``from`` names (values: user, assistant, system, tool or function_call)."""

    columns: dict[str, str] = field(default_factory=dict)
    sharegpt_roles: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, column in self.columns.items():
            if COLUMN_ALIASES.get(key, key) not in KNOWN_FIELDS:
                known = sorted(set(KNOWN_FIELDS) | set(COLUMN_ALIASES))
                raise ValueError(f"--columns {key}={column}: unknown field {key!r}; map one of {known}")
        allowed = set(SHAREGPT_ROLES.values())
        for name, role in self.sharegpt_roles.items():
            if role not in allowed:
                raise ValueError(f"--sharegpt_roles {name}={role}: unknown role {role!r}; use one of {sorted(allowed)}")

    @classmethod
    def from_flags(cls, columns: str | None, sharegpt_roles: str | None) -> FormatOptions:
        return cls(parse_mapping(columns, "--columns"), parse_mapping(sharegpt_roles, "--sharegpt_roles"))


def parse_mapping(text: str | dict | None, flag: str) -> dict[str, str]:
    """``"a=b,c=d"`` (a flag) or a dict (the YAML file) as a ``{a: b, c: d}`` dict."""
    if not text:
        return {}
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    mapping = {}
    for pair in text.split(","):
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"{flag} {text!r}: expected comma-separated key=value pairs, got {pair.strip()!r}")
        mapping[key] = value
    return mapping


def to_conversation(
    record: Any, where: str, system_prompt: str | None = None, options: FormatOptions | None = None
) -> dict[str, Any]:
    """Validate one record of any supported format and return ``{"messages": [...], "tools": list | None}``, with
    ``system_prompt`` first when the record brings no system turn of its own (its own wins)."""
    options = options or FormatOptions()
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    # A null field is an absent one: Arrow sources (parquet, save_to_disk, the Hub) give every row every column.
    record, names = _map_columns({k: v for k, v in record.items() if v is not None}, options.columns, where)
    tools = _tools(record.get("tools"), where, names["tools"])
    if "conversations" in record:
        messages = _sharegpt_messages(record, where, {**SHAREGPT_ROLES, **options.sharegpt_roles}, names)
    elif "messages" in record:
        messages = _messages(record["messages"], where, names["messages"])
    elif "instruction" in record or "output" in record:
        messages = _alpaca_messages(record, where, names)
    else:
        raise DataError(
            f"{where}: missing field: a record needs 'messages' (chat format) "
            f"or 'instruction' and 'output' (alpaca format); found fields {sorted(record)}"
        )
    if system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return {"messages": messages, "tools": tools}


def to_messages(record: Any, system_prompt: str | None = None, where: str = "record") -> list[dict[str, Any]]:
    """The conversation of one record (any format), validated, without its tools: what an eval prompt needs."""
    return to_conversation(record, where, system_prompt)["messages"]


class _FieldNames(dict):
    """Known field -> the name the record gave it: the ``--columns`` column it was renamed from, else the field's
    own name, so that errors name what the user wrote (``field 'thought'``, not ``'reasoning'``)."""

    def __missing__(self, field_name: str) -> str:
        return field_name


def _map_columns(record: dict, columns: dict[str, str], where: str) -> tuple[dict, _FieldNames]:
    """Rename the dataset's columns to the known fields (``prompt``/``query`` → instruction, ``response`` → output),
    and say which column each renamed field came from.

    A record already in a known format needs none of the mapped columns, so one ``--columns`` serves a mixture of
    layouts; a record in no known format is told which mapped column it lacks.
    """
    names = _FieldNames()
    if not columns:
        return record, names  # already the caller's own copy
    mapped = dict(record)
    missing = []
    for key, column in columns.items():
        if column in record:
            mapped[COLUMN_ALIASES.get(key, key)] = mapped.pop(column)
            names[COLUMN_ALIASES.get(key, key)] = column
        else:
            missing.append((key, column))
    if unmet := _unmet_columns(missing, mapped):
        key, column = unmet[0]
        raise DataError(f"{where}: missing field '{column}' (mapped to {key} by --columns); found fields {sorted(record)}")
    return mapped, names


def _unmet_columns(missing: list[tuple[str, str]], mapped: dict) -> list[tuple[str, str]]:
    """The missing mapped columns the record needed: all of them when it is in no known format, else the alpaca
    field (instruction, output) it still lacks, so the user hears of their column, not of 'output' they never wrote."""
    if not any(name in mapped for name in FORMAT_FIELDS):
        return missing
    if "messages" in mapped or "conversations" in mapped:
        return []
    return [(key, column) for key, column in missing if COLUMN_ALIASES.get(key, key) in ALPACA_FIELDS - mapped.keys()]


def _tools(tools: Any, where: str, name: str) -> list[dict] | None:
    """A record's tool schemas: a list of objects, or that list as a JSON string (LLaMA-Factory stores it so)."""
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: field '{name}' is not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise DataError(f"{where}: field '{name}' must be a list of tool schemas (objects)")
    return tools


def _sharegpt_messages(record: dict, where: str, roles: dict[str, str], names: _FieldNames) -> list[dict[str, Any]]:
    """ShareGPT turns as messages; a ``function_call`` turn becomes an assistant turn carrying that tool call."""
    turns, list_name = record["conversations"], names["conversations"]
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: field '{list_name}' must be a non-empty list of {{from, value}} objects")
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        name = f"{list_name}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(f"{where}: field '{name}' must be an object with 'from' and 'value'")
        speaker, value = turn.get("from"), turn.get("value")
        if speaker not in roles:
            raise DataError(
                f"{where}: field '{name}.from': unknown speaker {speaker!r}; use one of {sorted(roles)} "
                "or map it with --sharegpt_roles NAME=ROLE"
            )
        if not isinstance(value, str):
            raise DataError(f"{where}: field '{name}.value' must be a string, got {type(value).__name__}")
        role = roles[speaker]
        reasoning = {"reasoning_content": turn["reasoning_content"]} if "reasoning_content" in turn else {}
        if role == "function_call":
            call = _sharegpt_call(value, where, name)
            messages.append({"role": "assistant", "content": "", "tool_calls": [call], **reasoning})
        else:
            messages.append({"role": role, "content": value, **reasoning})
    messages = _messages(messages, where, list_name, validate_calls=False, content_field="value")
    system = record.get("system")
    if system:  # prepended after validation, so errors index the record's own turns
        if not isinstance(system, str):
            raise DataError(f"{where}: field '{names['system']}' must be a string, got {type(system).__name__}")
        if messages[0]["role"] == "system":
            raise DataError(f"{where}: field '{names['system']}': {list_name}[0] is a system turn already; keep one "
                            "of them")  # fmt: skip
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _sharegpt_call(value: str, where: str, name: str) -> dict[str, Any]:
    try:
        call = json.loads(value)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{where}: field '{name}.value': tool call is not valid JSON ({err.msg} at column {err.colno})"
        ) from None
    return _tool_call({"function": call} if isinstance(call, dict) else call, where, f"{name}.value")


def _alpaca_messages(record: dict, where: str, names: _FieldNames) -> list[dict[str, Any]]:
    instruction = _string_field(record, "instruction", where, label=names["instruction"])
    output = _string_field(record, "output", where, label=names["output"])
    optional = {"required": False, "allow_empty": True}
    extra = _string_field(record, "input", where, label=names["input"], **optional)
    system = _string_field(record, "system", where, label=names["system"], **optional)
    reasoning = _string_field(record, "reasoning", where, label=names["reasoning"], **optional)
    messages = [{"role": "system", "content": system}] if system else []
    user = f"{instruction}\n{extra}" if extra else instruction
    answer = {"role": "assistant", "content": output} | ({"reasoning_content": reasoning} if reasoning else {})
    return messages + [{"role": "user", "content": user}, answer]


def _messages(
    messages: Any, where: str, list_name: str, validate_calls: bool = True, content_field: str = "content"
) -> list[dict[str, Any]]:
    """The one validator of turns: roles as in ``ROLES``, a system turn only first, content a non-empty string except
    beside tool calls (which only assistant turns make), reasoning only on assistant turns, some assistant turn.

    ``list_name`` and ``content_field`` are the record's own names (``conversations`` / ``value`` for ShareGPT), so
    errors point at the field the user wrote."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: field '{list_name}' must be a non-empty list of {{role, content}} objects")
    result = []
    for i, message in enumerate(messages):
        name = f"{list_name}[{i}]"
        if not isinstance(message, dict):
            raise DataError(f"{where}: field '{name}' must be an object with 'role' and 'content'")
        role = _string_field(message, "role", where, label=f"{name}.role")
        if role not in ROLES:
            raise DataError(f"{where}: field '{name}.role': unknown role {role!r}; use one of {list(ROLES)}")
        if role == "system" and i != 0:
            raise DataError(f"{where}: field '{name}.role': a system turn may only come first")
        calls = message.get("tool_calls") or []
        if calls and role != "assistant":
            raise DataError(f"{where}: field '{name}.tool_calls': only assistant turns make tool calls")
        content = "" if calls and message.get("content") is None else _string_field(
            message, "content", where, allow_empty=bool(calls), label=f"{name}.{content_field}"
        )
        out: dict[str, Any] = {"role": role, "content": content, **_reasoning(message, role, where, name)}
        if calls:
            if not isinstance(calls, list):
                raise DataError(f"{where}: field '{name}.tool_calls' must be a list")
            out["tool_calls"] = [
                _tool_call(call, where, f"{name}.tool_calls[{j}]") if validate_calls else call
                for j, call in enumerate(calls)
            ]
        result.append(out)
    if not any(m["role"] == "assistant" for m in result):
        raise DataError(f"{where}: field '{list_name}': no assistant turn, so there is nothing to train on")
    return result


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


def _string_field(
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


def _tool_call(call: Any, where: str, name: str) -> dict[str, Any]:
    """An OpenAI-style call ``{"type": "function", "function": {"name", "arguments"}}``; ``arguments`` given as a
    JSON string is parsed, since chat templates (Qwen2.5's) serialise it themselves with ``tojson``."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise DataError(f"{where}: field '{name}' must be an object with 'function': {{name, arguments}}")
    fn_name = function.get("name")
    if not isinstance(fn_name, str) or not fn_name.strip():
        raise DataError(f"{where}: field '{name}.function.name' must be a non-empty string")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{where}: field '{name}.function.arguments': tool call is not valid JSON "
                f"({err.msg} at column {err.colno})"
            ) from None
    if not isinstance(arguments, dict):
        raise DataError(f"{where}: field '{name}.function.arguments' must be a JSON object")
    return {"type": "function", "function": {"name": fn_name, "arguments": arguments}}
