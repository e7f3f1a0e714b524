"""Alpaca, with LLaMA-Factory's additions: an ``instruction`` (``input`` joined to it with a newline) answered by the
``output``, an optional ``system`` and ``reasoning``, the earlier rounds as ``history`` and the ``tools`` offered."""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.formats.registry import RecordFormat
from hf_lora_ds.data.formats.turns import Reading, string_field
from hf_lora_ds.data.records import DataError

__all__ = ["ALPACA"]


def alpaca(record: dict, reading: Reading) -> dict[str, Any]:
    tools = reading.tools(record)
    return {"messages": _messages(record, reading), "tools": tools}


def _messages(record: dict, reading: Reading) -> list[dict[str, Any]]:
    if "instruction" not in record and "prompt" in record:  # half of a TRL record mapped by --columns
        raise DataError(
            f"{reading.where}: missing field 'instruction' (alpaca); a TRL 'prompt'/'completion' record is read as it "
            "is without --columns, or as a chat turn with --columns prompt=prompt,response=completion"
        )
    where, names = reading.where, reading.names  # string_field, not reading.string: one call less a field
    instruction = string_field(record, "instruction", where, label=names["instruction"])
    output = string_field(record, "output", where, label=names["output"])
    optional = {"required": False, "allow_empty": True}
    extra = string_field(record, "input", where, label=names["input"], **optional)
    system = string_field(record, "system", where, label=names["system"], **optional)
    reasoning = string_field(record, "reasoning", where, label=names["reasoning"], **optional)
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
            content = string_field({"v": pair[j]}, "v", where, label=f"{name}[{k}][{j}]")
            messages.append({"role": role, "content": content})
    return messages


ALPACA = RecordFormat(
    "alpaca",
    fields=("instruction", "output"),
    convert=alpaca,
    reads=frozenset({"instruction", "input", "output", "system", "reasoning", "history", "tools", "images"}),
    describe="'instruction' and 'output' (alpaca, with 'history')",
)
