"""Chat messages, as TRL's conversational kinds and OpenAI write them: ``messages`` of ``{role, content}`` turns (a
content of typed parts, tool calls and their results, reasoning, training flags), and the ``tools`` offered."""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.formats.registry import RecordFormat
from hf_lora_ds.data.formats.turns import Reading

__all__ = ["MESSAGES"]


def messages(record: dict, reading: Reading) -> dict[str, Any]:
    tools = reading.tools(record)
    return {"messages": reading.messages(record["messages"], reading.names["messages"]), "tools": tools}


MESSAGES = RecordFormat(
    "messages",
    fields=("messages",),
    convert=messages,
    reads=frozenset({"messages", "tools", "images"}),
    describe="'messages' (chat; TRL conversational)",
)
