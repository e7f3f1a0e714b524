"""TRL's prompt/completion kinds: standard (two strings, trained as plain text, as TRL trains them) or conversational
(two lists of messages: the prompt's turns are context, the completion's assistant turns, several and with tool calls
and results among them, are what is trained). A prompt with no completion (TRL's prompt-only kind) is refused."""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.formats.registry import RecordFormat, accepted_kinds
from hf_lora_ds.data.formats.turns import Reading
from hf_lora_ds.data.records import DataError

__all__ = ["PROMPT_COMPLETION"]


def prompt_completion(record: dict, reading: Reading) -> dict[str, Any]:
    if "completion" not in record:
        raise DataError(
            f"{reading.where}: a 'prompt' without a 'completion' (TRL's prompt-only kind) has nothing to train on; "
            f"a record needs {accepted_kinds()}"
        )
    if isinstance(record["prompt"], str):
        return _plain_text(record, reading)
    tools = reading.tools(record)
    return {"messages": _conversational(record, reading), "tools": tools}


def _plain_text(record: dict, reading: Reading) -> dict[str, Any]:
    """The prompt untrained, the completion trained, no chat template (``hf_lora_ds.data.masking.plain_text``)."""
    prompt = reading.string(record, "prompt")
    if not isinstance(record["completion"], str):
        raise DataError(
            f"{reading.where}: field '{reading.names['completion']}' must be a string like the prompt (TRL's standard "
            f"kind), got {type(record['completion']).__name__}"
        )
    completion = reading.string(record, "completion")
    return {"text": prompt + completion, "prompt_chars": len(prompt), "messages": None, "tools": None}


def _conversational(record: dict, reading: Reading) -> list[dict[str, Any]]:
    prompt, completion, names = record["prompt"], record["completion"], reading.names
    if not isinstance(completion, list):
        raise DataError(
            f"{reading.where}: field '{names['completion']}' must be a list of messages like the prompt (TRL's "
            f"conversational kind), got {type(completion).__name__}"
        )
    first = reading.messages(prompt, names["prompt"], need_assistant=False)
    reading.offset = len(first)
    rest = reading.messages(completion, names["completion"], system_first=False)
    reading.completion_from = len(first)
    return first + rest


PROMPT_COMPLETION = RecordFormat(
    "prompt_completion",
    fields=("prompt", "completion"),
    convert=prompt_completion,
    reads=frozenset({"prompt", "completion", "tools", "images"}),
    identified_by=("prompt",),  # a completion alone is no TRL record
    describe="'prompt' and 'completion' (TRL, standard or conversational)",
)
