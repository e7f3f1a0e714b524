"""What a record must hold, in every format it may come in, converted to one validated conversation.

Users bring SFT data in the shape it was published in, so each record is recognised by its fields (alpaca, messages,
ShareGPT, TRL prompt/completion and text, tool calling, other columns through ``--columns``; docs/data.md shows each)
and turned into ``{"messages": [...], "tools": [...] | None}``. Every turn goes through one validator (``_messages``),
so a bad turn gets the same message, naming the record's location and the user's field, whatever the other turns hold.
Fields no reader uses are listed in ``unused``; another framework's field this package cannot honour (images,
preference pairs) is refused. A dataset's own column and speaker names come mapped by ``columns``; tool schemas and
calls are read by ``tool_calls``.
"""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.columns import (
    COLUMN_ALIASES,
    SHAREGPT_ROLES,
    FieldNames,
    FormatOptions,
    map_columns,
    parse_mapping,
)
from hf_lora_ds.data.content_parts import PARTS_KEY, Parts, join_parts
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.tool_calls import sharegpt_call, tool_call, tool_schemas
from hf_lora_ds.data.turn_flags import DETAIL_KEY, FLAG_KEYS, message_flag, train_detail

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
_PLAIN_KEYS = frozenset(("role", "content"))
# What each kind reads; any other field of a record is named as unused in the data summary.
USED_FIELDS = {
    "sharegpt": {"conversations", "system", "tools"},
    "messages": {"messages", "tools"},
    "prompt_completion": {"prompt", "completion", "tools"},
    "alpaca": {"instruction", "input", "output", "system", "reasoning", "history", "tools"},
    "text": {"text"},
}
USED_MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "reasoning_content", DETAIL_KEY, *FLAG_KEYS}
USED_TURN_KEYS = {"reasoning_content", DETAIL_KEY, *FLAG_KEYS}  # and the speaker and text keys
# Fields of other frameworks' records that this package cannot honour, and why: refused, never ignored.
REFUSED_FIELDS = {
    "images": "images (multimodal data: this package trains text-only models)",
    "videos": "videos (multimodal data: this package trains text-only models)",
    "audios": "audios (multimodal data: this package trains text-only models)",
    "chosen": "a preference pair (chosen/rejected: DPO or reward-model data, not SFT)",
    "rejected": "a preference pair (chosen/rejected: DPO or reward-model data, not SFT)",
    "kto_tag": "a KTO label (unpaired preference data, not SFT)",
}
ACCEPTED_KINDS = (
    "'messages' (chat; TRL conversational), 'conversations' (ShareGPT), 'instruction' and 'output' (alpaca, with "
    "'history'), 'prompt' and 'completion' (TRL, standard or conversational), or 'text' (TRL language modeling); "
    "other column names can be mapped with --columns (e.g. --columns prompt=question,response=answer)"
)


def to_conversation(
    record: Any, where: str, system_prompt: str | None = None, options: FormatOptions | None = None
) -> dict[str, Any]:
    """Validate one record of any supported format and return ``{"messages": [...], "tools": list | None}``, with
    ``system_prompt`` first when the record brings no system turn of its own (its own wins).

    Besides those: ``unused`` (the fields and message keys no reader used), and where the record says so,
    ``flags`` / ``detail`` (per-turn training flags by message index, ``hf_lora_ds.data.turn_flags``) and
    ``completion_from`` (the first message of a TRL completion). A plain-text record (TRL's standard kinds) is
    ``{"text", "prompt_chars", "messages": None, "tools": None}``: its text, and how much of it is prompt."""
    options = options or FormatOptions()
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    # A null field is an absent one: Arrow sources (parquet, save_to_disk, the Hub) give every row every column.
    record, names = map_columns({k: v for k, v in record.items() if v is not None}, options.columns, where)
    _refuse_foreign_fields(record, where, names)
    kind = _kind(record, where)
    if kind == "text" or (kind == "prompt_completion" and isinstance(record["prompt"], str)):
        conversation = _plain_text(record, kind, where, names)
        conversation["unused"] = _unused(record, kind, names, [])
        return conversation
    tools = tool_schemas(record["tools"], where, names["tools"]) if "tools" in record else None
    turns = _Turns(where)
    if kind == "sharegpt":
        roles = {**SHAREGPT_ROLES, **options.sharegpt_roles}
        messages = _sharegpt_messages(record, where, (roles, options.turn_keys), names, turns)
    elif kind == "messages":
        messages = _messages(record["messages"], where, names["messages"], turns=turns)
    elif kind == "prompt_completion":
        messages = _prompt_completion(record, where, names, turns)
    else:
        messages = _alpaca_messages(record, where, names)
    if system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
        turns.shift(1)
    conversation = {"messages": messages, "tools": tools, "unused": _unused(record, kind, names, turns.unused)}
    conversation.update(turns.fields())
    return conversation


def to_messages(record: Any, system_prompt: str | None = None, where: str = "record") -> list[dict[str, Any]]:
    """The conversation of one record (any format), validated, without its tools: what an eval prompt needs."""
    conversation = to_conversation(record, where, system_prompt)
    if conversation["messages"] is None:
        raise DataError(
            f"{where}: a plain-text record (TRL's 'text' or string 'prompt'/'completion') has no chat turns to prompt "
            "a generation eval with; give the eval set as messages"
        )
    return conversation["messages"]


def _kind(record: dict, where: str) -> str:
    if "conversations" in record:
        return "sharegpt"
    if "messages" in record:
        return "messages"
    if "instruction" in record or "output" in record:
        return "alpaca"
    if "prompt" in record:
        if "completion" not in record:
            raise DataError(
                f"{where}: a 'prompt' without a 'completion' (TRL's prompt-only kind) has nothing to train on; "
                f"a record needs {ACCEPTED_KINDS}"
            )
        return "prompt_completion"
    if "text" in record:
        return "text"
    raise DataError(f"{where}: missing field: a record needs {ACCEPTED_KINDS}; found fields {sorted(record)}")


def _refuse_foreign_fields(record: dict, where: str, names: FieldNames) -> None:
    if isinstance(record.get("label"), bool):  # TRL's KTO kind, LLaMA-Factory's kto_tag: a verdict on the answer
        raise DataError(
            f"{where}: field '{names['label']}': unpaired preference data (KTO), not SFT; drop the records labelled "
            "false and the field"
        )
    if REFUSED_FIELDS.keys().isdisjoint(record):  # most records: none of them
        return
    for name, what in REFUSED_FIELDS.items():
        if record.get(name) not in (None, "", [], {}):
            raise DataError(
                f"{where}: field '{names[name]}' holds {what}, which this package cannot train on; "
                "drop the field or the record"
            )


def _unused(record: dict, kind: str, names: FieldNames, message_keys: list[str]) -> list[str]:
    """The record's fields its kind does not read (named as the user wrote them), then its unused message keys."""
    if not (unread := record.keys() - USED_FIELDS[kind]) and not message_keys:
        return []
    return sorted(names[name] for name in unread) + sorted(set(message_keys))


def _plain_text(record: dict, kind: str, where: str, names: FieldNames) -> dict[str, Any]:
    """TRL's standard kinds, trained as TRL trains them: no chat template, the completion (or all the text) learnt."""
    if kind == "text":
        text = _string_field(record, "text", where, label=names["text"])
        return {"text": text, "prompt_chars": 0, "messages": None, "tools": None}
    prompt = _string_field(record, "prompt", where, label=names["prompt"])
    completion = record["completion"]
    if not isinstance(completion, str):
        raise DataError(
            f"{where}: field '{names['completion']}' must be a string like the prompt (TRL's standard "
            f"kind), got {type(completion).__name__}"
        )
    completion = _string_field(record, "completion", where, label=names["completion"])
    return {"text": prompt + completion, "prompt_chars": len(prompt), "messages": None, "tools": None}


def _prompt_completion(record: dict, where: str, names: FieldNames, turns: _Turns) -> list[dict[str, Any]]:
    """TRL's conversational prompt/completion: the prompt's turns are context, the completion's assistant turns
    (several, tool calls and results among them) are what is trained."""
    prompt, completion = record["prompt"], record["completion"]
    if not isinstance(completion, list):
        raise DataError(
            f"{where}: field '{names['completion']}' must be a list of messages like the prompt (TRL's "
            f"conversational kind), got {type(completion).__name__}"
        )
    first = _messages(prompt, where, names["prompt"], need_assistant=False, turns=turns)
    turns.offset = len(first)
    rest = _messages(completion, where, names["completion"], turns=turns, system_first=False)
    turns.completion_from = len(first)
    return first + rest


class _Turns:
    """What a record's turns say besides role and content, gathered while they are validated: training flags and
    spans by message index, the first message of a TRL completion, and the message keys nothing reads."""

    def __init__(self, where: str):
        self.where = where
        self.offset = 0  # index of the list being read within the conversation (a TRL completion follows its prompt)
        self.flags: dict[int, bool] = {}
        self.detail: dict[int, list[tuple[int, int, bool]]] = {}
        self.completion_from = 0
        self.unused: list[str] = []

    def read(self, message: dict, role: str, content: str, i: int, name: str, list_name: str, used: set[str]) -> None:
        flag = message_flag(message, role, self.where, name)
        if flag is not None:
            self.flags[self.offset + i] = flag
        detail = train_detail(message, content, role, self.where, name)
        if detail is not None:
            self.detail[self.offset + i] = detail
        self.unused += _unused_keys(message, used, list_name)

    def shift(self, by: int) -> None:
        """Message indices after a system turn was put first."""
        self.flags = {i + by: v for i, v in self.flags.items()}
        self.detail = {i + by: v for i, v in self.detail.items()}
        self.completion_from += by if self.completion_from else 0

    def fields(self) -> dict[str, Any]:
        found = {"flags": self.flags, "detail": self.detail, "completion_from": self.completion_from}
        return {key: value for key, value in found.items() if value}


def _unused_keys(message: dict, used: set[str], list_name: str) -> list[str]:
    """The keys of a message that no reader uses, as ``messages[].name``; a null one is an absent one (Arrow gives
    every message of a column every key any message has)."""
    return [f"{list_name}[].{key}" for key in message.keys() - used if message[key] is not None]


def _sharegpt_messages(
    record: dict, where: str, speakers: tuple[dict[str, str], tuple[str, str]], names: FieldNames, flags: _Turns
) -> list[dict[str, Any]]:
    """ShareGPT turns as messages; a ``function_call`` turn becomes an assistant turn carrying that tool call.
    ``speakers``: the roles of the ``from`` names, and the turn's speaker and text keys (``from``, ``value``)."""
    (roles, (role_key, text_key)), used = speakers, USED_TURN_KEYS | set(speakers[1])
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
        flags.unused += _unused_keys(turn, used, list_name)
        if role == "function_call":
            call = sharegpt_call(value, where, name)
            messages.append({"role": "assistant", "content": "", "tool_calls": [call], **extras})
        else:
            messages.append({"role": role, "content": value, **extras})
    messages = _messages(messages, where, list_name, validate_calls=False, content_field=text_key, turns=flags)
    system = record.get("system")
    if system:  # prepended after validation, so errors index the record's own turns
        if not isinstance(system, str):
            raise DataError(f"{where}: field '{names['system']}' must be a string, got {type(system).__name__}")
        if messages[0]["role"] == "system":
            raise DataError(
                f"{where}: field '{names['system']}': {list_name}[0] is a system turn already; keep one of them"
            )
        messages.insert(0, {"role": "system", "content": system})
        flags.shift(1)
    return messages


def _alpaca_messages(record: dict, where: str, names: FieldNames) -> list[dict[str, Any]]:
    if "instruction" not in record and "prompt" in record:  # half of a TRL record mapped by --columns
        raise DataError(
            f"{where}: missing field 'instruction' (alpaca); a TRL 'prompt'/'completion' record is read as it is "
            "without --columns, or as a chat turn with --columns prompt=prompt,response=completion"
        )
    instruction = _string_field(record, "instruction", where, label=names["instruction"])
    output = _string_field(record, "output", where, label=names["output"])
    optional = {"required": False, "allow_empty": True}
    extra = _string_field(record, "input", where, label=names["input"], **optional)
    system = _string_field(record, "system", where, label=names["system"], **optional)
    reasoning = _string_field(record, "reasoning", where, label=names["reasoning"], **optional)
    messages = [{"role": "system", "content": system}] if system else []
    messages += _history(record.get("history"), where, names["history"])
    user = f"{instruction}\n{extra}" if extra else instruction
    answer = {"role": "assistant", "content": output} | ({"reasoning_content": reasoning} if reasoning else {})
    return messages + [{"role": "user", "content": user}, answer]


def _history(history: Any, where: str, name: str) -> list[dict[str, Any]]:
    """LLaMA-Factory's ``history``: ``[[query, answer], ...]``, the rounds before the instruction, oldest first."""
    if history is None or history == []:
        return []
    if not isinstance(history, list):
        raise DataError(f"{where}: field '{name}' must be a list of [query, answer] pairs")
    messages = []
    for k, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise DataError(f"{where}: field '{name}[{k}]' must be a [query, answer] pair")
        for role, j in (("user", 0), ("assistant", 1)):
            content = _string_field({"v": pair[j]}, "v", where, label=f"{name}[{k}][{j}]")
            messages.append({"role": role, "content": content})
    return messages


def _messages(
    messages: Any,
    where: str,
    list_name: str,
    validate_calls: bool = True,
    content_field: str = "content",
    *,
    turns: _Turns | None = None,
    need_assistant: bool = True,
    system_first: bool = True,
) -> list[dict[str, Any]]:
    """The one validator of turns: roles as in ``ROLES``, a system turn only first, content a non-empty string (or
    a list of text parts) except beside tool calls (which only assistant turns make), reasoning only on assistant
    turns, some assistant turn (unless ``need_assistant`` is off: a TRL prompt); training flags read into ``turns``.

    ``list_name`` and ``content_field`` are the record's own names (``conversations`` / ``value`` for ShareGPT), so
    errors point at the field the user wrote. ``system_first`` off: the list continues a conversation (a TRL
    completion), so no turn of it may be a system turn."""
    turns = turns or _Turns(where)
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
        role = _string_field(message, "role", where, label=f"{name}.role")
        if role not in ROLES:
            raise DataError(f"{where}: field '{name}.role': unknown role {role!r}; use one of {list(ROLES)}")
        if role == "system" and (i != 0 or not system_first):
            raise DataError(f"{where}: field '{name}.role': a system turn may only come first")
        given = message.get("content")
        message = _parts_read(message, role, where, f"{name}.{content_field}")
        calls = message.get("tool_calls") or []
        if calls and role != "assistant":
            raise DataError(f"{where}: field '{name}.tool_calls': only assistant turns make tool calls")
        content = (
            ""
            if calls and message.get("content") is None
            else _string_field(message, "content", where, allow_empty=bool(calls), label=f"{name}.{content_field}")
        )
        out: dict[str, Any] = {"role": role, "content": content, **_reasoning(message, role, where, name)}
        if isinstance(given, list):  # for a template that iterates the parts itself (hf_lora_ds.data.content_parts)
            out[PARTS_KEY] = [
                part if "text" in part else {**part, "text": part["value"]}  # LLaMA-Factory v1's
                for part in given
                if part["type"] == "text"
            ]
        if role == "tool" and message.get("tool_call_id") is not None:  # Mistral's templates write it
            out["tool_call_id"] = _string_field(message, "tool_call_id", where, label=f"{name}.tool_call_id")
        if calls:
            if not isinstance(calls, list):
                raise DataError(f"{where}: field '{name}.tool_calls' must be a list")
            out["tool_calls"] = [
                tool_call(call, where, f"{name}.tool_calls[{j}]") if validate_calls else call
                for j, call in enumerate(calls)
            ]
        turns.read(message, role, content, i, name, list_name, USED_MESSAGE_KEYS)
        result.append(out)
    if need_assistant and not any(m["role"] == "assistant" for m in result):
        raise DataError(f"{where}: field '{list_name}': no assistant turn, so there is nothing to train on")
    return result


def _plain_turn(message: Any, first: bool) -> bool:
    """Whether ``message`` is a valid turn of a role and a non-blank text and nothing else: most turns, which need no
    more reading (no parts, calls, reasoning, flags or unused keys), so the validator takes them as they are."""
    if type(message) is not dict or not message.keys() <= _PLAIN_KEYS:
        return False
    role, content = message.get("role"), message.get("content")
    return role in ROLES and (first or role != "system") and type(content) is str and content.strip() != ""


def _parts_read(message: dict, role: str, where: str, name: str) -> dict:
    """A message whose content is a list of parts, as one with their text joined, their reasoning as
    ``reasoning_content``, their tool calls added to its ``tool_calls`` (``hf_lora_ds.data.content_parts``) and
    their training flags (axolotl's per-part ``train``) as the ``train_detail`` of the text they cover."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = join_parts(content, where, name)
    joined = {**message, "content": parts.text}
    if detail := _part_flags(parts, role, where):
        if message.get(DETAIL_KEY) is not None:
            raise DataError(f"{where}: field '{name}': training flags on its parts and a {DETAIL_KEY}; give one")
        joined[DETAIL_KEY] = detail
    if parts.reasoning and not message.get("reasoning_content"):
        joined["reasoning_content"] = parts.reasoning
    if parts.calls:
        joined["tool_calls"] = [*(message.get("tool_calls") or []), *parts.calls]
    return joined


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
