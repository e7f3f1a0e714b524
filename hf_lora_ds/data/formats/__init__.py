"""What a record must hold, in every format it may come in, converted to one validated conversation.

Users bring SFT data in the shape it was published in, so each record is recognised by its fields and read by its
format, one module each: ``sharegpt``, ``messages`` (and tool calling), ``alpaca``, ``prompt_completion`` and ``text``
(TRL's), registered in that order, the order a record is recognised in; docs/data.md shows each. A user's own format
registers the same way (``register_format``, ``registry``). Every format ends as ``{"messages": [...], "tools": [...] |
None}`` (``to_conversation``, ``conversation``), its turns through one validator (``turns``), so a bad turn gets the
same message, naming the record's location and the user's field, whatever the other turns hold. A dataset's own
column and speaker names come mapped by ``columns``; tool schemas and calls are read by
``hf_lora_ds.data.records.tool_calls``.
"""

from hf_lora_ds.data.formats import alpaca, messages, prompt_completion, sharegpt, text
from hf_lora_ds.data.formats.columns import COLUMN_ALIASES, SHAREGPT_ROLES, FormatOptions, parse_mapping
from hf_lora_ds.data.formats.conversation import to_conversation, to_messages
from hf_lora_ds.data.formats.registry import RecordFormat, available_formats, register_format
from hf_lora_ds.data.formats.turns import ROLES, Reading

__all__ = [
    "FormatOptions",
    "ROLES",
    "SHAREGPT_ROLES",
    "COLUMN_ALIASES",
    "parse_mapping",
    "to_conversation",
    "to_messages",
    "register_format",
    "available_formats",
    "RecordFormat",
    "Reading",
]

for _built_in in (sharegpt.SHAREGPT, messages.MESSAGES, alpaca.ALPACA, prompt_completion.PROMPT_COMPLETION, text.TEXT):
    register_format(_built_in)
